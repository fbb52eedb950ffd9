"""What the experiments share: optimizers by name, JSON and TensorBoard scalars.

Each experiment's `Config` checks its optimizer with `check_optimizer`; its
`run` makes it with `make_optimizer` and writes its outputs with `write_json`
and `write_scalars`.
"""

import inspect
import json

import keras
import tensorflow as tf

__all__ = [
    "OPTIMIZERS",
    "SCALAR_METADATA",
    "check_optimizer",
    "make_optimizer",
    "write_json",
    "write_scalars",
]


def _optimizer_classes():
    """Maps each keras optimizer that takes just a learning rate to its class."""
    classes = {}
    for name in dir(keras.optimizers):
        cls = getattr(keras.optimizers, name)
        if not (
            inspect.isclass(cls)
            and issubclass(cls, keras.optimizers.Optimizer)
            and cls is not keras.optimizers.Optimizer
        ):
            continue
        params = inspect.signature(cls).parameters
        required = [
            p
            for p in params.values()
            if p.default is inspect.Parameter.empty
            and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
        ]
        # Wrappers (LossScaleOptimizer, MultiOptimizer) need other optimizers.
        if "learning_rate" in params and not required:
            classes[name.lower()] = cls
    return classes


# Lower-case name -> class, for every optimizer `make_optimizer` can make.
OPTIMIZERS = _optimizer_classes()


def check_optimizer(name):
    """Raises ValueError unless `name` is in `OPTIMIZERS`, in any case."""
    if not isinstance(name, str) or name.lower() not in OPTIMIZERS:
        raise ValueError(
            "Received an unknown `optimizer`, expected one of the keras.optimizers"
            f" names (known ones are {', '.join(sorted(OPTIMIZERS))})."
            f" Received: optimizer={name!r}"
        )


def make_optimizer(name, learning_rate):
    """Returns a new `keras.optimizers` optimizer called `name` (any case).

    Raises:
      ValueError: if `name` is not in `OPTIMIZERS`; the message lists them.
    """
    check_optimizer(name)
    return OPTIMIZERS[name.lower()](learning_rate=learning_rate)


def write_json(path, value):
    """Writes `value` to `path` as indented JSON with sorted keys."""
    with open(path, "w") as f:
        json.dump(value, f, indent=2, sort_keys=True)
        f.write("\n")


# What `tf.summary.scalar` attaches, so TensorBoard shows these as scalars;
# `tf.summary.scalar` itself lives in the tensorboard package, which
# tensorflow 2.21 does not install.
SCALAR_METADATA = tf.compat.v1.SummaryMetadata(
    plugin_data=tf.compat.v1.SummaryMetadata.PluginData(plugin_name="scalars"),
    data_class="DATA_CLASS_SCALAR",
)


def write_scalars(writer, step, scalars):
    """Writes each `{tag: value}` of `scalars` at `step` as a TensorBoard scalar."""
    with writer.as_default(step=step):
        for tag, value in scalars.items():
            tf.summary.write(
                tag, tf.constant(value, tf.float32), metadata=SCALAR_METADATA
            )
