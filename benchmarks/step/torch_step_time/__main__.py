"""`python -m benchmarks.torch_step_time`: masked step time over stock Keras, on torch."""

import os

# Keras fixes its backend when first imported: this benchmark measures torch's.
os.environ["KERAS_BACKEND"] = "torch"

from absl import app  # noqa: E402

from benchmarks.torch_step_time import lib  # noqa: E402
from experiments.common import cli  # noqa: E402

main = cli.config_main(
    lib.Config, lib.run, workdir="runs/torch_step_time", table=lib.format_table
)

if __name__ == "__main__":
    app.run(main)
