"""TensorBoard scalars without the tensorboard package: `write_scalars`.

`tf.summary.scalar` lives in the tensorboard package, which TensorFlow 2.21
does not install; `tf.summary.write` with the scalars plugin's metadata
writes the same events, which TensorBoard shows as scalars.
"""

import tensorflow as tf

__all__ = ["SCALAR_METADATA", "write_scalars"]

# What `tf.summary.scalar` attaches, so TensorBoard shows these as scalars.
SCALAR_METADATA = tf.compat.v1.SummaryMetadata(
    plugin_data=tf.compat.v1.SummaryMetadata.PluginData(plugin_name="scalars"),
    data_class="DATA_CLASS_SCALAR",
)


def write_scalars(writer, step, scalars):
    """Writes each `{tag: value}` of `scalars` at `step` as a TensorBoard scalar.

    Args:
      writer: a `tf.summary` writer, e.g. `tf.summary.create_file_writer(dir)`.
      step: the step to write them at (an integer).
      scalars: a dict from tag to a number.

    Example:

    >>> import tempfile, tensorflow as tf
    >>> from maskfit.scalars import write_scalars
    >>> writer = tf.summary.create_file_writer(tempfile.mkdtemp())
    >>> write_scalars(writer, 1, {"loss": 0.5})
    """
    with writer.as_default(step=step):
        for tag, value in scalars.items():
            tf.summary.write(
                tag, tf.constant(value, tf.float32), metadata=SCALAR_METADATA
            )
