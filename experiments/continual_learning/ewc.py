"""Elastic weight consolidation (Kirkpatrick et al., PNAS 2017), the baseline.

Fine-tuning plus a quadratic penalty that pulls each weight back towards its
values after earlier tasks, in proportion to its (diagonal, empirical) Fisher
information there:

    L(θ) = L_t(θ) + strength / 2 · Σ_k Σ_i F_k,i (θ_i - θ*_k,i)²

over the earlier tasks k. The sum of quadratics is one quadratic (up to a
constant, which moves no gradient): Σ_k F_k (θ - θ*_k)² = F (θ - θ̄)² + c with
F = Σ_k F_k and θ̄ = Σ_k F_k θ*_k / F; so each weight keeps one Fisher and one
anchor, as `keras.Variable`s that the penalty reads, updated after each task
(under TensorFlow without retracing; under JAX they are constants of the
jitted step, which every training compiles anew after the update). The penalty is the weight's Keras `regularizer`, so the
model's own `compute_loss` adds it (`model.losses`).

F_k,i is the mean over up to `samples` training examples of task k of the
squared per-example gradient of the example's loss (the cross-entropy of
its label: the empirical Fisher).
"""

import keras
import numpy as np
from keras import ops

from experiments.continual_learning import methods, net

__all__ = ["EWC"]


class _Penalty(keras.regularizers.Regularizer):
    """strength / 2 · Σ fisher · (w - anchor)², with its state in keras.Variables."""

    def __init__(self, strength, fisher, anchor):
        self.strength = strength
        self.fisher = fisher
        self.anchor = anchor

    def __call__(self, x):
        return 0.5 * self.strength * ops.sum(self.fisher * ops.square(x - self.anchor))


class EWC(methods.TaskTraining):
    """Fine-tuning with the EWC penalty on every kernel and bias."""

    name = "ewc"

    def __init__(self, network, settings, seed, epochs, strength, samples):
        self.network = network
        self._seed = seed
        self.networks = [network]
        self._settings = settings
        self._epochs = epochs
        self._samples = samples
        self._variables = [v for l in network.layers for v in (l.kernel, l.bias)]
        self._penalties = []
        for variable in self._variables:
            zeros = np.zeros(variable.shape, np.float32)
            penalty = _Penalty(
                strength,
                keras.Variable(zeros, trainable=False),
                keras.Variable(zeros, trainable=False),
            )
            variable.regularizer = penalty
            self._penalties.append(penalty)
        self._squared_gradients = _squared_gradients_fn(
            network.model,
            net.task_loss(network.heads, network.classes_per_head),
            self._variables,
        )

    def learn(self, task_index, task):
        methods.learn_heads_only(self.network, task.head)
        self.train_task(task_index, task)
        rng = np.random.default_rng([self._seed, task_index, 2])
        count = min(self._samples, len(task.x_train))
        chosen = rng.choice(len(task.x_train), size=count, replace=False)
        fishers = [
            ops.convert_to_numpy(f)
            for f in self._squared_gradients(task.x_train[chosen], task.y_train[chosen])
        ]
        for variable, penalty, fisher in zip(self._variables, self._penalties, fishers):
            old = penalty.fisher.numpy()
            total = old + fisher
            value = variable.numpy()
            weighted = old * penalty.anchor.numpy() + fisher * value
            safe = np.where(total > 0, total, 1)
            penalty.anchor.assign(np.where(total > 0, weighted / safe, value))
            penalty.fisher.assign(total)

    def logits(self, task_index, task, x):
        return self.network.task_logits(self._settings, x, task.head)


def _squared_gradients_fn(model, loss, variables):
    """`(x, y) -> [mean over examples of the squared gradient]` per variable.

    The per-example gradients of `loss` (the example's own cross-entropy)
    with respect to `variables`: `tf.vectorized_map` of a tape under
    TensorFlow, `jax.vmap` of `jax.grad` of the model's stateless call
    under JAX.
    """
    if keras.backend.backend() == "jax":
        import jax

        positions = [
            next(i for i, v in enumerate(model.trainable_variables) if v is variable)
            for variable in variables
        ]

        def one(trainable, non_trainable, x, y):
            logits, _ = model.stateless_call(
                trainable, non_trainable, x[None], training=False
            )
            return loss(y[None], logits)[0]

        @jax.jit
        def squared(trainable, non_trainable, x, y):
            grads = jax.vmap(jax.grad(one), in_axes=(None, None, 0, 0))(
                trainable, non_trainable, x, y
            )
            return [(grads[p] ** 2).mean(axis=0) for p in positions]

        def run(x, y):
            return squared(
                [v.value for v in model.trainable_variables],
                [v.value for v in model.non_trainable_variables],
                x,
                y,
            )

        return run
    import tensorflow as tf

    @tf.function
    def squared_gradients(x, y):
        def one(example):
            xi, yi = example
            with tf.GradientTape() as tape:
                value = loss(yi[None], model(xi[None], training=False))
            return [tf.square(g) for g in tape.gradient(value, variables)]

        return [tf.reduce_mean(g, axis=0) for g in tf.vectorized_map(one, (x, y))]

    return lambda x, y: squared_gradients(tf.constant(x), tf.constant(y))
