"""Structured pruning beside Torch-Pruning: `python -m benchmarks.structured_vs_torch_pruning`.

Needs the `structured-peer` extra for the torch arm (CPU torch and
torch-pruning; see docs/structured_pruning.md, "Against Torch-Pruning", for the install).
Trains issue 23's MLP and ResNet on digits and MNIST-1D, prunes 25/50/75% of
the units of every coupled group gradually, fine-tunes, and reports per
fraction the parameters and MACs removed, the accuracy over seeds, the
latency of the shrunk model over its dense one (batch 1 and 64) and the time
the pruning takes. `--frameworks` picks the arms (`structured_lib.ARMS`):
`maskfit` (maskfit's structured pruning), `torch` (Torch-Pruning), and
`keras` (the dense Keras network and Keras models of the shrunk shapes); by
default maskfit and torch where torch is installed, maskfit alone elsewhere. Writes `config.json`,
`structured_vs_torch_pruning.json` and `structured_vs_torch_pruning.md` under
`--workdir`.
"""

from absl import app, flags
from benchmarks.structured_vs_torch_pruning import lib as structured_lib

from experiments import common

_LISTS = {  # Flag -> the type of its items.
    "datasets": str,
    "architectures": str,
    "fractions": float,
    "seeds": int,
    "frameworks": str,
    "mlp_hidden": int,
    "resnet_widths": int,
    "latency_batches": int,
    "threads": int,
}
_HELP = {
    "datasets": "digits, mnist1d.",
    "architectures": "mlp, resnet.",
    "fractions": "Fractions of each unit group pruned (0: the unpruned reference).",
    "seeds": "Seeds; each trains its own dense network.",
    "frameworks": f"Arms: {', '.join(sorted(structured_lib.ARMS))} (default: maskfit,"
    " and torch where installed).",
    "optimizer": "adam or sgd (momentum 0.9), in every framework.",
    "learning_rate": "Constant learning rate.",
    "batch_size": "Examples per step.",
    "epochs": "Dense epochs before pruning.",
    "prune_epochs": "Epochs over which the pruning steps are spread.",
    "prune_steps": "Pruning steps (Torch-Pruning's iterative_steps).",
    "finetune_epochs": "Epochs after the pruning epochs.",
    "importance_p": "Norm of the magnitude importance (1 or 2).",
    "round_to": "Every group keeps a multiple of this many units.",
    "mlp_hidden": "The MLP's hidden units.",
    "resnet_widths": "The ResNet's channels per stage.",
    "resnet_blocks": "Blocks per stage (1: ResNet-8, 3: ResNet-20).",
    "latency_batches": "Batch sizes timed.",
    "latency_rounds": "Interleaved rounds timed per batch size.",
    "round_seconds": "About how long the dense model runs per round.",
    "keras_path": "Keras inference path: tflite (LiteRT), function, xla, predict_on_batch, eager.",
    "torch_path": "PyTorch inference path: eager, trace, compile.",
    "jit_compile": "Keras trains with XLA.",
    "threads": "intra_op,inter_op threads of both frameworks (0,0: defaults).",
    "max_train_examples": "Keep this many training examples (0: all).",
}
_FLAGS = common.define_config_flags(structured_lib.Config, _HELP, _LISTS)
_WORKDIR = flags.DEFINE_string(
    "workdir", "runs/structured_vs_torch_pruning", "Where to write."
)


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"Too many command-line arguments: {argv[1:]}")
    try:
        config = structured_lib.Config(**common.flag_values(_FLAGS, _LISTS))
    except ValueError as e:
        raise app.UsageError(str(e)) from e
    results = structured_lib.run(config, _WORKDIR.value)
    print(structured_lib.format_markdown(results))


if __name__ == "__main__":
    app.run(main)
