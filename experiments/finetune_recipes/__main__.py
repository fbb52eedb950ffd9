"""`python -m experiments.finetune_recipes --workdir DIR`: flags into a Config, then run."""

import dataclasses

from absl import app, flags, logging

from experiments import common
from experiments.finetune_recipes import lib

HELPS = {
    "length": "Bytes per snippet and per pretraining window.",
    "hidden_dim": "Width of the GPT-2 backbone.",
    "num_layers": "Transformer layers of the backbone.",
    "num_heads": "Attention heads.",
    "intermediate_dim": "Width of the feed-forward layers.",
    "pretrain_steps": "Steps of next-byte pretraining.",
    "pretrain_learning_rate": "AdamW learning rate of pretraining.",
    "batch_size": "Batch size of pretraining and fine-tuning.",
    "train_per_class": "Training snippets per package (small data).",
    "test_per_class": "Test snippets per package (from other files).",
    "epochs": "Fine-tuning epochs.",
    "learning_rate": "AdamW learning rate of fine-tuning (every method).",
    "weight_decay": "AdamW weight decay of fine-tuning.",
    "decay": "Layer-wise learning-rate decay per block.",
    "sparse_steps": "Steps of the short full pass that chooses sparse entries.",
    "seeds": "Seeds; each method runs once per seed.",
    "methods": f"Methods to compare, 'full' among them: {', '.join(lib.METHODS)}.",
    "isolate": "Run each method in a fresh process (its own peak memory).",
}
LISTS = {"seeds": int, "methods": str}

WORKDIR = flags.DEFINE_string("workdir", None, "Where to write the results.")
FLAGS = common.define_config_flags(lib.Config, HELPS, LISTS)


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected arguments: {' '.join(argv[1:])}")
    if not WORKDIR.value:
        raise app.UsageError("--workdir is required.")
    try:
        config = lib.Config(**common.flag_values(FLAGS, LISTS))
    except ValueError as e:
        raise app.UsageError(str(e)) from None
    metrics = lib.run(config, WORKDIR.value)
    logging.info("config %s", dataclasses.asdict(config))
    for name, m in metrics["methods"].items():
        logging.info(
            "%s accuracy %.3f +- %.3f learnable %d step %.1f ms",
            name,
            m["accuracy_mean"],
            m["accuracy_std"],
            m["learnable"],
            m["step_ms"],
        )
    logging.info(
        "wall %.0f s, cpu %.0f s", metrics["wall_seconds"], metrics["cpu_seconds"]
    )


if __name__ == "__main__":
    app.run(main)
