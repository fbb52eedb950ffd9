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

import dataclasses
import time

from absl import logging

from experiments import common
from experiments.llm_compression import compress, report
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
    calibration_batch: int = 8
    validation_windows: int = 32
    learning_rate: float = 2e-3
    weight_decay: float = 0.01
    run_eagerly: bool = False

    def __post_init__(self):
        for name in ("methods", "targets", "healed", "quantize", "seeds"):
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


def _seed(config, seed, corpus, validation, first):
    arch, optimizer = config.architecture, config.optimizer
    windows = corpus.batches(
        config.train_steps + config.heal_steps, config.batch_size, config.context, seed
    )
    train, heal = windows[: config.train_steps], windows[config.train_steps :]
    calibration = compress.calibration_batches(
        heal.reshape(-1, heal.shape[-1])[: config.calibration], config.calibration_batch
    )
    dense = keras_arm.build(arch, seed)
    keras_arm.train(dense, train, optimizer, config.run_eagerly)
    dense_ppl = keras_arm.perplexity(dense, validation)
    logging.info("seed %d dense: ppl %.3f", seed, dense_ppl)
    runs = [dict(method="dense", target="-", seed=seed, perplexity=dense_ppl)]
    for method in config.methods:
        for target in config.targets:
            model = keras_arm.clone(dense, arch, seed)
            found, seconds, peak = compress.prune(model, method, target, calibration)
            row = dict(
                method=method, target=target, seed=seed, sparsity=found.sparsity,
                refused=len(found.refused), seconds=seconds, peak_bytes=peak,
                error=sum(r.error for r in found.layers) / len(found.layers),
                perplexity=keras_arm.perplexity(model, validation),
            )  # fmt: skip
            if target in config.healed:
                compress.heal(model, heal, optimizer, config.run_eagerly)
                row["healed_perplexity"] = keras_arm.perplexity(model, validation)
            if first and target in config.healed:
                row["quantized"] = [
                    compress.quantized(model, mode, arch, seed, validation)
                    for mode in config.quantize
                ]
            logging.info("seed %d %s %s: ppl %.3f healed %s", seed, method, target,
                         row["perplexity"], row.get("healed_perplexity"))  # fmt: skip
            runs.append(row)
    if first and config.quantize:
        # A copy: the trained model's file would hold its optimizer's state too.
        runs[0]["file_bytes"] = compress.saved_bytes(keras_arm.clone(dense, arch, seed))
    # The dense model given the healing steps too: what healing alone buys.
    keras_arm.train(dense, heal, optimizer, config.run_eagerly)
    runs.append(
        dict(
            runs[0], target="healed", perplexity=keras_arm.perplexity(dense, validation)
        )
    )
    return runs


def run(config, workdir):
    """Runs the experiment; writes its files under `workdir` and returns the metrics.

    Writes `config.json` (the config, the corpus's Python version and hash),
    `metrics.json` (machine, every run, the summary, seconds),
    `llm_compression.md` (the tables) and `llm_compression.png`
    (perplexity against sparsity per method).
    """
    import os

    start = time.perf_counter()
    os.makedirs(workdir, exist_ok=True)
    corpus = corpus_lib.load()
    common.write_json(
        os.path.join(workdir, "config.json"),
        dict(dataclasses.asdict(config), corpus=corpus.describe()),
    )
    validation = corpus.validation_windows(config.validation_windows, config.context)
    runs = []
    for index, seed in enumerate(config.seeds):
        runs += _seed(config, seed, corpus, validation, first=index == 0)
    metrics = {
        "machine": _machine({}),
        "runs": runs,
        "summary": report.summarize(runs),
        "seconds": time.perf_counter() - start,
    }
    common.write_json(os.path.join(workdir, "metrics.json"), metrics)
    with open(os.path.join(workdir, "llm_compression.md"), "w") as f:
        f.write(report.format_tables(metrics))
    report.plot(metrics, os.path.join(workdir, "llm_compression.png"))
    return metrics
