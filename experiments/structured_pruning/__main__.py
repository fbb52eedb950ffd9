r"""Structured pruning with maskfit: accuracy against measured CPU latency.

Trains issue 23's MLP (1024-1024 hidden) and ResNet-8 (32/64/128 channels,
batch norm) on scikit-learn's digits and MNIST-1D (no download), prunes
25/50/75% of every unit group gradually with `maskfit.pruning.prune_units`
(L2 magnitude, `round_to=8`), fine-tunes, shrinks with
`maskfit.pruning.shrink`, and reports per fraction the parameters, MACs,
test accuracy over seeds, and the CPU latency of the shrunk and the dense
model (batch 1 and 64, compiled inference, median over interleaved rounds).
Writes `config.json`, `metrics.json`, `structured_pruning.md` and
`structured_pruning.png` under `--workdir`. The defaults take about 10
minutes on 2 cores. The logic is in `experiments.structured_pruning.lib`.

Usage (docs/structured_pruning.md has the results):
  python -m experiments.structured_pruning --workdir=/tmp/structured_pruning
  python -m experiments.structured_pruning --datasets=mnist1d --seeds=0,1,2 \
      --epochs=20 --prune_epochs=5 --prune_steps=5 --finetune_epochs=10 \
      --workdir=/tmp/structured_mnist1d
"""

from absl import app

from experiments.common import cli
from experiments.structured_pruning.lib import Config, run

HELP = {
    "datasets": "digits, mnist1d.",
    "architectures": "mlp, resnet.",
    "fractions": "Fractions of every unit group pruned, in (0, 1).",
    "seeds": "Seeds; each trains its own dense network.",
    "optimizer": "adam or sgd (momentum 0.9).",
    "learning_rate": "Constant learning rate.",
    "batch_size": "Examples per step.",
    "epochs": "Dense epochs before pruning.",
    "prune_epochs": "Epochs over which the pruning steps are spread.",
    "prune_steps": "Pruning steps (the fraction grows in equal steps).",
    "finetune_epochs": "Epochs after the pruning epochs.",
    "importance_p": "Magnitude importance |w|^p: 1 or 2.",
    "round_to": "Every group keeps a multiple of this many units.",
    "mlp_hidden": "The MLP's hidden units.",
    "resnet_widths": "The ResNet's channels per stage.",
    "resnet_blocks": "Blocks per stage (1: ResNet-8, 3: ResNet-20).",
    "latency_batches": "Batch sizes timed.",
    "latency_rounds": "Interleaved rounds timed per batch size.",
    "round_seconds": "About how long the dense model runs per round.",
    "keras_path": "Inference path timed: tflite (LiteRT), function, xla, predict_on_batch, eager.",
    "jit_compile": "Train with XLA.",
    "run_eagerly": "Train eagerly (no tracing; for tiny runs only).",
    "threads": "TensorFlow's intra_op,inter_op threads (0,0: its defaults).",
    "max_train_examples": "Keep this many training examples (0: all).",
}


def _print_table(config, results, workdir):
    del config, results
    with open(f"{workdir}/structured_pruning.md") as f:
        print(f.read())


main = cli.config_main(Config, run, HELP, show=_print_table)

if __name__ == "__main__":
    app.run(main)
