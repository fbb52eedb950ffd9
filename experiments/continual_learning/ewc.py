"""Elastic weight consolidation (Kirkpatrick et al., PNAS 2017), the baseline.

Fine-tuning plus a quadratic penalty that pulls each weight back towards its
values after earlier tasks, in proportion to its (diagonal, empirical) Fisher
information there:

    L(θ) = L_t(θ) + strength / 2 · Σ_k Σ_i F_k,i (θ_i - θ*_k,i)²

over the earlier tasks k. The sum of quadratics is one quadratic (up to a
constant, which moves no gradient): Σ_k F_k (θ - θ*_k)² = F (θ - θ̄)² + c with
F = Σ_k F_k and θ̄ = Σ_k F_k θ*_k / F; so each weight keeps one Fisher and one
anchor, as `tf.Variable`s that the penalty reads, updated after each task
without retracing. The penalty is the weight's Keras `regularizer`, so the
model's own `compute_loss` adds it (`model.losses`).

F_k,i is the mean over up to `samples` training examples of task k of the
squared per-example gradient of the example's loss (the cross-entropy of
its label: the empirical Fisher).
"""

import keras
import numpy as np
import tensorflow as tf

from experiments.continual_learning import methods, net

__all__ = ["EWC"]


class _Penalty(keras.regularizers.Regularizer):
    """strength / 2 · Σ fisher · (w - anchor)², with its state in tf.Variables."""

    def __init__(self, strength, fisher, anchor):
        self.strength = strength
        self.fisher = fisher
        self.anchor = anchor

    def __call__(self, x):
        return (
            0.5
            * self.strength
            * tf.reduce_sum(self.fisher * tf.square(x - self.anchor))
        )


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
            penalty = _Penalty(strength, tf.Variable(zeros), tf.Variable(zeros))
            variable.regularizer = penalty
            self._penalties.append(penalty)
        model, loss = (
            network.model,
            net.task_loss(network.heads, network.classes_per_head),
        )

        @tf.function
        def squared_gradients(x, y):
            def one(example):
                xi, yi = example
                with tf.GradientTape() as tape:
                    value = loss(yi[None], model(xi[None], training=False))
                return [tf.square(g) for g in tape.gradient(value, self._variables)]

            return [tf.reduce_mean(g, axis=0) for g in tf.vectorized_map(one, (x, y))]

        self._squared_gradients = squared_gradients

    def learn(self, task_index, task):
        methods.learn_heads_only(self.network, task.head)
        self.train_task(task_index, task)
        rng = np.random.default_rng([self._seed, task_index, 2])
        count = min(self._samples, len(task.x_train))
        chosen = rng.choice(len(task.x_train), size=count, replace=False)
        fishers = self._squared_gradients(
            tf.constant(task.x_train[chosen]), tf.constant(task.y_train[chosen])
        )
        for variable, penalty, fisher in zip(self._variables, self._penalties, fishers):
            old = penalty.fisher.numpy()
            total = old + fisher.numpy()
            value = variable.numpy()
            weighted = old * penalty.anchor.numpy() + fisher.numpy() * value
            safe = np.where(total > 0, total, 1)
            penalty.anchor.assign(np.where(total > 0, weighted / safe, value))
            penalty.fisher.assign(total)

    def logits(self, task_index, task, x):
        return self.network.task_logits(self._settings, x, task.head)
