"""The LLM-compression experiment: Config and `run(config, workdir)`.

Per seed, the Llama causal LM of `experiments.transformer_pruning`
(`keras_arm.Architecture`, its shared initial weights `weights.draw`) is
trained dense on the same windows of Python's own text (`corpus`), in the
same order, with the same AdamW. Then a copy per method (magnitude, Wanda,
SparseGPT) and target (50/60/70% unstructured, 2:4, 4:8) is pruned one-shot
from calibration windows (`maskfit.prune_oneshot`): validation perplexity,
the pass's seconds and peak NumPy memory; the targets in `healed` are then
fine-tuned for `heal_steps` with their masks and measured again. On the
first seed each healed model is also quantized (int8, int4): the pruned
entries still 0, the perplexity, the saved file's size.
"""

import contextlib
import dataclasses
import os
import time

from absl import logging

from experiments import common
from experiments.llm_compression import compress, peer, report
from experiments.transformer_pruning import corpus as corpus_lib
from experiments.transformer_pruning import keras_arm
from experiments.transformer_pruning.lib import _machine

__all__ = ["Config", "run"]

METHODS = ("magnitude", "wanda", "sparsegpt")
MODES = ("int8", "int4")


@dataclasses.dataclass(frozen=True)
class Config:
    """What to run; the defaults take about 15 minutes on 2 cores.

    Attributes:
      layers: Transformer blocks.
      hidden: Residual width.
      query_heads: Query heads per block.
      kv_heads: Key/value heads per block.
      ffn: Gated FFN units per block.
      context: Tokens per window (bytes).
      methods: One-shot methods: magnitude, wanda, sparsegpt.
      targets: Sparsities ("50%") and N:M patterns ("2:4") pruned to.
      healed: The targets also fine-tuned after pruning (with their masks).
      quantize: Quantization modes tried on the first seed's healed models
        (after healing, as one would deploy them): int8, int4.
      seeds: Seeds; each trains its own dense model.
      batch_size: Windows per training step.
      train_steps: Dense training steps.
      heal_steps: Fine-tuning steps after pruning.
      calibration: Calibration windows (from the healing windows).
      calibration_batch: Calibration windows per forward pass.
      validation_windows: Held-out windows perplexity is measured on.
      learning_rate: AdamW's constant learning rate.
      weight_decay: AdamW's decoupled weight decay.
      run_eagerly: Train eagerly (tiny runs only).
      peer_python: The Python of a virtual environment with llmcompressor
        (docs/oneshot.md); if set, each seed's dense model is also pruned by
        llmcompressor (Hugging Face's Llama of the same weights, the same
        calibration windows and batches) at `peer_targets`, in that Python's
        own process. Empty: no side by side.
      peer_targets: The targets the side by side prunes to.
    """

    layers: int = 4
    hidden: int = 128
    query_heads: int = 4
    kv_heads: int = 4
    ffn: int = 344
    context: int = 128
    methods: tuple = METHODS
    targets: tuple = compress.TARGETS
    healed: tuple = ("2:4",)
    quantize: tuple = MODES
    seeds: tuple = (0, 1, 2)
    batch_size: int = 8
    train_steps: int = 200
    heal_steps: int = 20
    calibration: int = 32
    calibration_batch: int = 32
    validation_windows: int = 32
    learning_rate: float = 2e-3
    weight_decay: float = 0.01
    run_eagerly: bool = False
    peer_python: str = ""
    peer_targets: tuple = ("50%", "2:4", "4:8")

    def __post_init__(self):
        for name in ("methods", "targets", "healed", "quantize", "seeds",
                     "peer_targets"):  # fmt: skip
            object.__setattr__(self, name, tuple(getattr(self, name)))
        for name in (
            "layers", "hidden", "query_heads", "kv_heads", "ffn", "context",
            "batch_size", "train_steps", "heal_steps", "calibration",
            "calibration_batch", "validation_windows",
        ):  # fmt: skip
            common.check_int(name, getattr(self, name), 1)
        if self.query_heads % self.kv_heads or self.hidden % self.query_heads:
            raise ValueError(
                "Received an invalid architecture, expected kv_heads to divide"
                " query_heads and query_heads to divide hidden. Received:"
                f" hidden={self.hidden}, query_heads={self.query_heads},"
                f" kv_heads={self.kv_heads}"
            )
        if self.calibration > self.batch_size * self.heal_steps:
            raise ValueError(
                "Received an invalid value for `calibration`, expected at most"
                " batch_size * heal_steps windows (they come from the healing"
                f" windows). Received: calibration={self.calibration}"
            )
        for name, known in (("methods", METHODS), ("quantize", MODES)):
            values = getattr(self, name)
            if any(v not in known for v in values) or (
                name == "methods" and not values
            ):
                raise ValueError(
                    f"Received an invalid value for `{name}`, expected a list of"
                    f" {known}. Received: {name}={values!r}"
                )
        if not self.targets or not self.seeds:
            raise ValueError(
                "Received no targets or no seeds, expected at least one of each."
                f" Received: targets={self.targets!r}, seeds={self.seeds!r}"
            )
        for target in self.targets:
            compress.parse_target(target)
        if self.peer_python and not os.access(self.peer_python, os.X_OK):
            raise ValueError(
                "Received an invalid value for `peer_python`, expected the path of"
                " a Python with llmcompressor (e.g. /work/venv-llmc/bin/python)."
                f" Received: peer_python={self.peer_python!r}"
            )
        if self.peer_python and not all(t in self.targets for t in self.peer_targets):
            raise ValueError(
                "Received an invalid value for `peer_targets`, expected targets"
                f" among {self.targets}. Received: peer_targets={self.peer_targets!r}"
            )
        if any(target not in self.targets for target in self.healed):
            raise ValueError(
                "Received an invalid value for `healed`, expected targets among"
                f" {self.targets}. Received: healed={self.healed!r}"
            )
        if not self.learning_rate > 0 or self.weight_decay < 0:
            raise ValueError(
                "Received an invalid optimizer, expected learning_rate > 0 and"
                f" weight_decay >= 0. Received: learning_rate={self.learning_rate},"
                f" weight_decay={self.weight_decay}"
            )

    @property
    def architecture(self):
        return keras_arm.Architecture(
            self.layers, self.hidden, self.query_heads, self.kv_heads, self.ffn,
            self.context, corpus_lib.VOCABULARY,
        )  # fmt: skip

    @property
    def optimizer(self):
        return keras_arm.Optimizer(self.learning_rate, self.weight_decay)


class _Clock:
    """Wall and CPU seconds per stage of the run (where the time goes)."""

    def __init__(self):
        self.stages = {}

    @contextlib.contextmanager
    def stage(self, name):
        wall, cpu = time.perf_counter(), time.process_time()
        try:
            yield
        finally:
            spent = self.stages.setdefault(name, {"seconds": 0.0, "cpu_seconds": 0.0})
            spent["seconds"] += time.perf_counter() - wall
            spent["cpu_seconds"] += time.process_time() - cpu


def _seed(config, seed, corpus, validation, first, clock, workdir):
    arch, optimizer = config.architecture, config.optimizer
    windows = corpus.batches(
        config.train_steps + config.heal_steps, config.batch_size, config.context, seed
    )
    train, heal = windows[: config.train_steps], windows[config.train_steps :]
    calibration_windows = heal.reshape(-1, heal.shape[-1])[: config.calibration]
    calibration = compress.calibration_batches(
        calibration_windows, config.calibration_batch
    )
    with clock.stage("train dense"):
        dense = keras_arm.build(arch, seed)
        keras_arm.train(dense, train, optimizer, config.run_eagerly)
    with clock.stage("perplexity"):
        dense_ppl = keras_arm.perplexity(dense, validation)
    logging.info("seed %d dense: ppl %.3f", seed, dense_ppl)
    runs = [dict(method="dense", target="-", seed=seed, perplexity=dense_ppl)]
    for method in config.methods:
        for target in config.targets:
            with clock.stage("prune"):
                model = keras_arm.clone(dense, arch, seed)
                found, (seconds, cpu), peak = compress.prune(
                    model, method, target, calibration
                )
            row = dict(
                method=method, target=target, seed=seed, sparsity=found.sparsity,
                refused=len(found.refused), seconds=seconds, cpu_seconds=cpu,
                peak_bytes=peak,
                error=sum(r.error for r in found.layers) / len(found.layers),
            )  # fmt: skip
            with clock.stage("perplexity"):
                row["perplexity"] = keras_arm.perplexity(model, validation)
            if target in config.healed:
                with clock.stage("heal"):
                    compress.heal(model, heal, optimizer, config.run_eagerly)
                with clock.stage("perplexity"):
                    row["healed_perplexity"] = keras_arm.perplexity(model, validation)
            if first and target in config.healed:
                with clock.stage("quantize"):
                    row["quantized"] = [
                        compress.quantized(model, mode, arch, seed, validation)
                        for mode in config.quantize
                    ]
            logging.info("seed %d %s %s: ppl %.3f healed %s", seed, method, target,
                         row["perplexity"], row.get("healed_perplexity"))  # fmt: skip
            runs.append(row)
    if first and config.quantize:
        with clock.stage("quantize"):
            # A copy: the trained model's file would hold its optimizer's state too.
            copy = keras_arm.clone(dense, arch, seed)
            runs[0]["file_bytes"] = compress.saved_bytes(copy)
    if config.peer_python:
        with clock.stage("llmcompressor (its own process)"):
            runs += _peer(config, seed, dense, calibration_windows, validation, workdir)
    # The dense model given the healing steps too: what healing alone buys.
    with clock.stage("heal"):
        keras_arm.train(dense, heal, optimizer, config.run_eagerly)
    with clock.stage("perplexity"):
        healed = keras_arm.perplexity(dense, validation)
    runs.append(dict(runs[0], target="healed", perplexity=healed))
    return runs


def _peer(config, seed, dense, calibration_windows, validation, workdir):
    """llmcompressor's rows for this seed's dense model (`peer.run_arm`)."""
    folder = os.path.join(workdir, "llmcompressor")
    os.makedirs(folder, exist_ok=True)
    inputs = os.path.join(folder, f"seed{seed}.npz")
    peer.write_inputs(
        inputs, dense, config.architecture, seed, calibration_windows[:, :-1],
        config.calibration_batch, validation, config.methods, config.peer_targets,
    )  # fmt: skip
    found = peer.run_arm(config.peer_python, inputs, inputs[:-4] + ".json")
    os.remove(inputs)  # the weights again: the JSON is what the run keeps
    for row in found["runs"]:
        row.pop("traceback", None)
        row["versions"] = found["versions"]
    logging.info("seed %d llmcompressor: %s", seed, [
        (r["method"], r["target"], r.get("perplexity"), r.get("failure"))
        for r in found["runs"]])  # fmt: skip
    return found["runs"]


def run(config, workdir):
    """Runs the experiment; writes its files under `workdir` and returns the metrics.

    Writes `config.json` (the config, the corpus's Python version and hash),
    `metrics.json` (machine, every run, the summary, seconds),
    `llm_compression.md` (the tables) and `llm_compression.png`
    (perplexity against sparsity per method).
    """
    start, cpu = time.perf_counter(), time.process_time()
    clock = _Clock()
    os.makedirs(workdir, exist_ok=True)
    corpus = corpus_lib.load()
    common.write_json(
        os.path.join(workdir, "config.json"),
        dict(dataclasses.asdict(config), corpus=corpus.describe()),
    )
    validation = corpus.validation_windows(config.validation_windows, config.context)
    runs = []
    for index, seed in enumerate(config.seeds):
        runs += _seed(config, seed, corpus, validation, index == 0, clock, workdir)
    metrics = {
        "machine": _machine({}),
        "runs": runs,
        "summary": report.summarize(runs),
        "side_by_side": report.side_by_side(runs),
        "stages": clock.stages,
        "seconds": time.perf_counter() - start,
        # This process's CPU time (all its threads); the llmcompressor arm's own
        # process is not in it (its rows carry their cpu_seconds).
        "cpu_seconds": time.process_time() - cpu,
    }
    common.write_json(os.path.join(workdir, "metrics.json"), metrics)
    with open(os.path.join(workdir, "llm_compression.md"), "w") as f:
        f.write(report.format_tables(metrics))
    report.plot(metrics, os.path.join(workdir, "llm_compression.png"))
    return metrics
