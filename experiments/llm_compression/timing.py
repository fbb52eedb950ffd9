r"""maskfit's one-shot pass against llmcompressor's, timed in turns on one CPU.

The side by side of `experiments.llm_compression` times each framework's
passes in a block of their own (maskfit's of a seed, then llmcompressor's
arm), the arm niced, so a change of the machine's load between the blocks
lands on one side only. This runs the two in turns at one nice level: per
seed the experiment's dense Llama is trained as there (`Config`'s defaults),
then `--rounds` times maskfit's passes (`compress.prune`, Wanda and
SparseGPT at `--targets`) and llmcompressor's arm on the same weights and
windows (`peer.run_arm`, its own process, at this process's nice level).
Each side's first pass of a round is a magnitude pass, untimed: it warms
the imports and caches both sides would otherwise charge to the first
method. Writes `timing.json` (per seed, round, method and target: wall
and CPU seconds of each side's pass, perplexities) under `--workdir`.

Usage (docs/oneshot.md has the results):
  nice -n 15 python -m experiments.llm_compression.timing \
      --workdir=/tmp/llm_timing --peer_python=/path/venv-llmc/bin/python
"""

import os
import time

from absl import app, flags, logging

from experiments import common
from experiments.llm_compression import compress, peer
from experiments.llm_compression.lib import Config
from experiments.transformer_pruning import corpus as corpus_lib
from experiments.transformer_pruning import keras_arm

__all__ = ["run"]

_WORKDIR = flags.DEFINE_string("workdir", "/tmp/llm_timing", "Where timing.json goes.")
_PEER = flags.DEFINE_string("peer_python", "", "The Python of llmcompressor's venv.")
_SEEDS = flags.DEFINE_list("seeds", ["0", "1", "2"], "Seeds (each its dense model).")
_TARGETS = flags.DEFINE_list("targets", ["50%", "2:4", "4:8"], "Targets timed.")
_ROUNDS = flags.DEFINE_integer("rounds", 2, "Turns of each side per seed.")

METHODS = ("wanda", "sparsegpt")


def _maskfit(dense, config, seed, calibration, validation, targets):
    arch = config.architecture
    rows = []
    for method in ("magnitude",) + METHODS:  # magnitude: the warm-up
        for target in targets[:1] if method == "magnitude" else targets:
            model = keras_arm.clone(dense, arch, seed)
            _, (seconds, cpu), _ = compress.prune(model, method, target, calibration)
            if method != "magnitude":
                rows.append(dict(framework="maskfit", method=method, target=target,
                                 seconds=seconds, cpu_seconds=cpu,
                                 perplexity=keras_arm.perplexity(model, validation)))  # fmt: skip
    return rows


def _arm(python, dense, config, seed, windows, validation, targets, path):
    peer.write_inputs(
        path, dense, config.architecture, seed, windows[:, :-1],
        config.calibration_batch, validation, ("magnitude",) + METHODS, targets,
    )  # fmt: skip
    found = peer.run_arm(python, path, path[:-4] + ".json", nice=0)
    return [
        {k: row.get(k) for k in ("framework", "method", "target", "seconds",
                                 "cpu_seconds", "perplexity", "failure")}
        for row in found["runs"] if row["method"] in METHODS
    ]  # fmt: skip


def run(python, seeds, targets, rounds, workdir):
    """The turns' rows, also written to `workdir/timing.json`."""
    config = Config()
    os.makedirs(workdir, exist_ok=True)
    corpus = corpus_lib.load()
    validation = corpus.validation_windows(config.validation_windows, config.context)
    rows = []
    for seed in seeds:
        windows = corpus.batches(config.train_steps + config.heal_steps,
                                 config.batch_size, config.context, seed)  # fmt: skip
        heal = windows[config.train_steps :]
        chosen = heal.reshape(-1, heal.shape[-1])[: config.calibration]
        calibration = compress.calibration_batches(chosen, config.calibration_batch)
        dense = keras_arm.build(config.architecture, seed)
        keras_arm.train(dense, windows[: config.train_steps], config.optimizer)
        path = os.path.join(workdir, f"seed{seed}.npz")
        for turn in range(rounds):
            for side in ("maskfit", "llmcompressor"):
                start = time.perf_counter()
                if side == "maskfit":
                    found = _maskfit(dense, config, seed, calibration, validation,
                                     targets)  # fmt: skip
                else:
                    found = _arm(python, dense, config, seed, chosen, validation,
                                 targets, path)  # fmt: skip
                for row in found:
                    row.update(seed=seed, round=turn)
                rows += found
                logging.info("seed %d round %d %s: %.1f s", seed, turn, side,
                             time.perf_counter() - start)  # fmt: skip
        os.remove(path)
    common.write_json(os.path.join(workdir, "timing.json"), {"rows": rows})
    return rows


def main(argv):
    del argv
    if not _PEER.value:
        raise app.UsageError("--peer_python is needed (llmcompressor's venv)")
    rows = run(_PEER.value, [int(s) for s in _SEEDS.value], tuple(_TARGETS.value),
               _ROUNDS.value, _WORKDIR.value)  # fmt: skip
    for row in rows:
        print(row)


if __name__ == "__main__":
    app.run(main)
