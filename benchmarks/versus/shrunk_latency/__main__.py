from absl import app
from benchmarks.shrunk_latency import lib

from experiments.common import cli, datasets

HELP = {
    "dataset": "Input shape of the networks.",
    "architectures": "mlp, resnet.",
    "mlp_hidden": "The MLP's hidden units.",
    "resnet_widths": "Channels per stage.",
    "resnet_blocks": "Blocks per stage (1: ResNet-8, 3: -20).",
    "fraction": "Fraction of each unit group removed.",
    "round_to": "Kept units are a multiple of this.",
    "frameworks": "keras, torch.",
    "keras_paths": "function, xla, predict_on_batch, eager, tflite.",
    "torch_paths": "eager, trace, compile.",
    "batches": "Batch sizes.",
    "rounds": "Interleaved rounds timed.",
    "round_seconds": "About how long each model runs per round.",
    "threads": "intra_op,inter_op threads of both frameworks (0,0: their defaults).",
}


def _show(config, rows, workdir):
    del config, workdir
    print(lib.format_table(rows))


main = cli.config_main(
    lib.Config,
    lib.run,
    HELP,
    workdir="runs/shrunk_latency",
    show=_show,
    choices={"dataset": datasets.NAMES},
)

if __name__ == "__main__":
    app.run(main)
