"""The network every method trains, its loss, its training and its per-task logits.

`Network` is an MLP whose output holds one head per task of a split
sequence (or one shared head): hidden Dense layers with ReLU, then a Dense
`head` layer of `heads * classes_per_head` logits, in a
`maskfit.MaskedModel`. `task_loss` picks the head of each example from its
label, so one compiled model trains any task. `Network.train` trains it on
one task with a new optimizer; `Network.task_logits` is the head's logits
for one task, optionally with some kernel entries replaced by 0 in the
forward pass only (PackNet's per-task inference masks).
"""

import dataclasses

import keras
import numpy as np
from keras import ops

import maskfit
from experiments import common

__all__ = ["Network", "TrainSettings", "parameter_count", "task_loss"]


@dataclasses.dataclass(frozen=True)
class TrainSettings:
    """How each task is trained: optimizer, batches and execution mode.

    Attributes:
      optimizer: a `keras.optimizers` name (any case).
      learning_rate: its learning rate.
      weight_decay: passed to the optimizer when not None (else its default).
      batch_size: examples per step.
      compile_kwargs: extra `compile` arguments: `jit_compile`,
        `run_eagerly`, `steps_per_execution`.
    """

    optimizer: str = "adam"
    learning_rate: float = 1e-3
    weight_decay: float = None
    batch_size: int = 64
    compile_kwargs: dict = dataclasses.field(default_factory=dict)

    def make_optimizer(self):
        """A new optimizer: every task (and phase) starts from fresh state."""
        common.check_optimizer(self.optimizer)
        kwargs = {"learning_rate": self.learning_rate}
        if self.weight_decay is not None:
            kwargs["weight_decay"] = self.weight_decay
        return common.OPTIMIZERS[self.optimizer.lower()](**kwargs)


def task_loss(heads, classes_per_head):
    """The cross-entropy of each example's label on its own head's logits.

    Args:
      heads: the heads in the model's output.
      classes_per_head: the logits per head.

    Returns:
      A loss function `(y_true, y_pred) -> per-example loss`, where `y_true`
      holds the data set's labels and `y_pred` all heads' logits.

    Example:

    >>> import numpy as np
    >>> loss = task_loss(heads=2, classes_per_head=2)
    >>> logits = np.array([[9.0, -9.0, 0.0, 5.0]], np.float32)
    >>> float(loss(np.array([3]), logits)[0]) < 0.01  # Label 3: head 1, class 1.
    True
    """

    def loss(y_true, y_pred):
        labels = ops.cast(ops.reshape(y_true, [-1]), "int32")
        logits = ops.reshape(y_pred, [-1, heads, classes_per_head])
        # The own head's logits: the others times 0 add +-0, so the values
        # and gradients are those of a gather, on every backend.
        chosen = ops.one_hot(labels // classes_per_head, heads, dtype=logits.dtype)
        own = ops.sum(logits * chosen[:, :, None], axis=1)
        return keras.losses.sparse_categorical_crossentropy(
            labels % classes_per_head, own, from_logits=True
        )

    return loss


def parameter_count(features, hidden_units, outputs):
    """Kernel and bias entries of an MLP with these layer widths."""
    widths = (features, *hidden_units, outputs)
    return sum((a + 1) * b for a, b in zip(widths[:-1], widths[1:]))


class Network:
    """An MLP with per-task heads in a `maskfit.MaskedModel`.

    Attributes:
      model: the `maskfit.MaskedModel`.
      layers: its Dense layers, input to output (the last is `head`).
      heads, classes_per_head: the output's layout.
    """

    def __init__(
        self,
        features,
        hidden_units,
        heads,
        classes_per_head,
        entropy,
        model_class=None,
        numpy_weights=False,
    ):
        """Builds the network; `entropy` (ints) seeds every layer's initializer.

        `model_class` (default `maskfit.MaskedModel`) is called as
        `model_class(inputs, outputs)` to make the model. With `numpy_weights`
        the kernels are drawn by NumPy (`common.glorot_uniform`, the same
        entropy): the same weights under every backend.
        """
        self.heads = heads
        self.classes_per_head = classes_per_head
        inputs = keras.Input((features,))
        outputs, self.layers = inputs, []
        widths = (*hidden_units, heads * classes_per_head)
        for index, units in enumerate(widths):
            last = index == len(widths) - 1
            seed = int(np.random.SeedSequence([*entropy, index]).generate_state(1)[0])
            layer = keras.layers.Dense(
                units,
                activation=None if last else "relu",
                kernel_initializer=keras.initializers.GlorotUniform(seed=seed),
                name="head" if last else f"hidden_{index + 1}",
            )
            outputs = layer(outputs)
            self.layers.append(layer)
        self.model = (model_class or maskfit.MaskedModel)(inputs, outputs)
        if numpy_weights:
            for index, layer in enumerate(self.layers):
                value = common.glorot_uniform(layer.kernel.shape, [*entropy, index])
                layer.kernel.assign(value)
        self._logits_fn = None

    def head_columns(self, head):
        """A bool vector over the head layer's units: those of `head`."""
        columns = np.zeros(self.heads * self.classes_per_head, bool)
        start = head * self.classes_per_head
        columns[start : start + self.classes_per_head] = True
        return columns

    def weights(self):
        """{layer name: [kernel, bias]} as numpy copies."""
        return {l.name: [l.kernel.numpy(), l.bias.numpy()] for l in self.layers}

    def train(self, settings, x, y, epochs, entropy):
        """Trains `epochs` passes over `(x, y)` with a new optimizer.

        The masks declared on the layers (`maskfit.set_mask`) decide what
        learns. The model is compiled with a new optimizer first, so every
        training starts from fresh optimizer state (step 0, zero moments), as
        PackNet's authors and Avalanche do. The batch order is drawn from
        `entropy`: the passes one after the other, each in a new random
        order, cut to whole batches (the last partial batch of the last pass
        is dropped, so that every step has one shape and XLA compiles the
        step once).
        """
        if epochs == 0:
            return
        self.model.compile(
            optimizer=settings.make_optimizer(),
            loss=task_loss(self.heads, self.classes_per_head),
            **settings.compile_kwargs,
        )
        rng = np.random.default_rng(list(entropy))
        order = np.concatenate([rng.permutation(len(x)) for _ in range(epochs)])
        order = order[: max(len(order) // settings.batch_size, 1) * settings.batch_size]
        self.model.fit(
            x[order],
            y[order],
            batch_size=settings.batch_size,
            epochs=1,
            shuffle=False,
            verbose=0,
        )

    def _make_logits_fn(self, settings):
        def current():
            # Read at each call (or trace): which variables are trainable can
            # change between tasks (heads frozen and thawed), and with it the
            # order `stateless_call` takes their values in.
            groups = (
                self.model.trainable_variables,
                self.model.non_trainable_variables,
            )
            where = tuple(
                next(
                    (g, i)
                    for g, group in enumerate(groups)
                    for i, v in enumerate(group)
                    if v is layer.kernel
                )
                for layer in self.layers
            )
            return where, [[v.value for v in group] for group in groups]

        def logits(where, values, x, head, keep):
            # The kernels' entries outside `keep` read as +0 in this forward
            # pass only: the variables themselves are not touched.
            values = [list(group) for group in values]
            for (g, i), k in zip(where, keep):
                values[g][i] = ops.where(k, values[g][i], ops.zeros_like(values[g][i]))
            outputs, _ = self.model.stateless_call(*values, x, training=False)
            outputs = ops.reshape(outputs, [-1, self.heads, self.classes_per_head])
            return ops.take(outputs, head, axis=1)

        compiled = not settings.compile_kwargs.get("run_eagerly")
        if keras.backend.backend() == "tensorflow" and compiled:
            import tensorflow as tf

            # Traced once for any number of examples (XLA compiles per
            # shape); the variables are read inside, at each call.
            signature = [
                tf.TensorSpec([None, self.layers[0].kernel.shape[0]], tf.float32),
                tf.TensorSpec([], tf.int32),
                [tf.TensorSpec(l.kernel.shape, tf.bool) for l in self.layers],
            ]
            return tf.function(
                lambda x, head, keep: logits(*current(), x, head, keep),
                input_signature=signature,
                jit_compile=bool(settings.compile_kwargs.get("jit_compile")),
            )
        if keras.backend.backend() == "jax" and compiled:
            import jax

            # The variables' values are arguments: a jitted function that read
            # them inside would keep those of its first call.
            jitted = jax.jit(logits, static_argnums=0)
            return lambda x, head, keep: jitted(*current(), x, head, keep)
        return lambda x, head, keep: logits(*current(), x, head, keep)

    def task_logits(self, settings, x, head, keep=None):
        """The logits of head `head` for `x`, kernels masked by `keep`.

        Args:
          settings: the `TrainSettings` (their mode: eager, graph or XLA).
          x: the examples.
          head: which head's logits.
          keep: None, or one bool array per layer (of its kernel's shape):
            the entries that take part in the forward pass; the others count
            as 0 (the variables are left alone).

        Returns:
          A numpy array `(len(x), classes_per_head)`.
        """
        if self._logits_fn is None:
            self._logits_fn = self._make_logits_fn(settings)
        if keep is None:
            keep = [np.ones(l.kernel.shape, bool) for l in self.layers]
        keep = [ops.convert_to_tensor(k, "bool") for k in keep]
        x, head = (
            ops.convert_to_tensor(x, "float32"),
            ops.convert_to_tensor(head, "int32"),
        )
        return ops.convert_to_numpy(self._logits_fn(x, head, keep))
