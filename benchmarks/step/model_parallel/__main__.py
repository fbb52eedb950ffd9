"""`python -m benchmarks.model_parallel`: masked step time under ModelParallel, on JAX.

JAX fixes its devices when it starts: unless `XLA_FLAGS` already asks for
some, the host's CPU is split into `lib.DEVICES` devices here, before JAX
is imported (on an accelerator host the flag leaves the accelerators alone).
"""

import os

# Keras fixes its backend when first imported: this benchmark measures JAX's.
os.environ["KERAS_BACKEND"] = "jax"
if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (
        os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
    ).strip()

from absl import app  # noqa: E402

from benchmarks.model_parallel import lib  # noqa: E402
from experiments.common import cli  # noqa: E402

main = cli.config_main(
    lib.Config, lib.run, workdir="runs/model_parallel", table=lib.format_table
)

if __name__ == "__main__":
    app.run(main)
