from absl import app
from benchmarks.structured_vs_torch_pruning import lib

from experiments.common import cli

HELP = {
    "datasets": "digits, mnist1d.",
    "architectures": "mlp, resnet.",
    "fractions": "Fractions of each unit group pruned (0: the unpruned reference).",
    "seeds": "Seeds; each trains its own dense network.",
    "frameworks": f"Arms: {', '.join(sorted(lib.ARMS))} (default: maskfit,"
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


def _show(config, results, workdir):
    del config, workdir
    print(lib.format_markdown(results))


main = cli.config_main(
    lib.Config, lib.run, HELP, workdir="runs/structured_vs_torch_pruning", show=_show
)

if __name__ == "__main__":
    app.run(main)
