"""The transformer-pruning experiment: Config and `run(config, workdir)`.

Per seed, both arms train the same Llama causal LM (`keras_arm.Architecture`)
from the same initial weights (`weights.draw`) on the same windows of
Python's own text (`corpus`) in the same order, with the same AdamW steps
(`keras_arm.TorchAdamW` on the Keras side). The maskfit arm then prunes a copy of it per
importance (magnitude, Taylor, activation), fraction and schedule (one-shot:
`select_units`, shrink, heal; gradual: `prune_units` in `fit` while it
heals, shrink), the Torch-Pruning arm per fraction as its LLM example does,
healed on the same windows. Validation perplexity and parameters per run;
latency of the shrunk models against the dense ones (seed 0, one thread,
interleaved rounds) through TensorFlow, XLA, LiteRT and PyTorch (`timing`).
"""

import copy
import dataclasses
import os
import time

import keras
import tensorflow as tf
from absl import logging

from experiments import common
from experiments.common import latency
from experiments.transformer_pruning import corpus as corpus_lib
from experiments.transformer_pruning import keras_arm, report, timing, torch_arm

__all__ = ["Config", "run"]

SCHEDULES = ("one_shot", "gradual")


@dataclasses.dataclass(frozen=True)
class Config:
    """What to run; the defaults take about 12 minutes of CPU time on one core.

    Attributes:
      layers: Transformer blocks.
      hidden: Residual width.
      query_heads: Query heads per block.
      kv_heads: Key/value heads per block (fewer than query_heads: grouped).
      ffn: Gated FFN units per block.
      context: Tokens per window (bytes).
      fractions: Fractions of the heads and FFN units removed, in (0, 1).
      importances: maskfit importances: magnitude, taylor, activation.
      schedules: one_shot (select, shrink, heal) and/or gradual (in fit).
      seeds: Seeds; each trains its own dense model in both arms.
      batch_size: Windows per step.
      train_steps: Dense training steps.
      heal_steps: Fine-tuning steps after one-shot pruning; the gradual
        schedule prunes over the first half of as many steps.
      gradual_updates: Pruning updates of the gradual schedule.
      calibration: Windows that Taylor and activation importances score on.
      validation_windows: Held-out windows perplexity is measured on.
      learning_rate: AdamW's constant learning rate.
      weight_decay: AdamW's decoupled weight decay.
      round_to: FFN units kept are a multiple of this (as the LLM example).
      latency_batches: Batch sizes timed.
      latency_rounds: Interleaved rounds timed per batch size.
      latency_paths: Keras paths timed: tensorflow, litert.
      threads: TensorFlow's intra_op,inter_op threads, set at the start (0,0:
        leave TensorFlow's; a process that has run TensorFlow already).
      torch: Run the Torch-Pruning arm when torch, transformers and
        torch-pruning are installed (the benchmark extra).
      shared_dense: The Torch-Pruning arm prunes the maskfit arm's trained
        dense model (its weights copied over) instead of training its own:
        both tools then cut the same weights, without the drift of two
        trainings (the default trains each arm's own, as the issue asks).
      run_eagerly: Train eagerly (tiny runs only).
    """

    layers: int = 4
    hidden: int = 128
    query_heads: int = 4
    kv_heads: int = 4
    ffn: int = 344
    context: int = 128
    fractions: tuple = (0.25, 0.5, 0.75)
    importances: tuple = keras_arm.IMPORTANCES
    schedules: tuple = SCHEDULES
    seeds: tuple = (0, 1, 2)
    batch_size: int = 8
    train_steps: int = 200
    heal_steps: int = 20
    gradual_updates: int = 4
    calibration: int = 8
    validation_windows: int = 32
    learning_rate: float = 2e-3
    weight_decay: float = 0.01
    round_to: int = 4
    latency_batches: tuple = (1, 16)
    latency_rounds: int = 5
    latency_paths: tuple = timing.PATHS
    threads: tuple = (1, 1)
    torch: bool = True
    shared_dense: bool = False
    run_eagerly: bool = False

    def __post_init__(self):
        for name in ("fractions", "importances", "schedules", "seeds"):
            object.__setattr__(self, name, tuple(getattr(self, name)))
        for name in ("latency_batches", "latency_paths", "threads"):
            object.__setattr__(self, name, tuple(getattr(self, name)))
        for name in (
            "layers", "hidden", "query_heads", "kv_heads", "ffn", "context",
            "batch_size", "train_steps", "heal_steps", "gradual_updates",
            "calibration", "validation_windows", "round_to", "latency_rounds",
        ):  # fmt: skip
            common.check_int(name, getattr(self, name), 1)
        if len(self.threads) != 2 or any(
            not isinstance(t, int) or t < 0 for t in self.threads
        ):
            raise ValueError(
                "Received an invalid value for `threads`, expected two integers"
                f" >= 0 (intra_op, inter_op). Received: threads={self.threads!r}"
            )
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
        for fraction in self.fractions:
            common.check_fraction("fractions", fraction, received=self.fractions)
        for name, known in (
            ("importances", keras_arm.IMPORTANCES),
            ("schedules", SCHEDULES),
            ("latency_paths", timing.PATHS),
        ):
            values = getattr(self, name)
            if not values or any(v not in known for v in values):
                raise ValueError(
                    f"Received an invalid value for `{name}`, expected a non-empty"
                    f" list of {known}. Received: {name}={values!r}"
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


def _machine(torch_versions):
    cpu = ""
    if os.path.exists("/proc/cpuinfo"):
        with open("/proc/cpuinfo") as f:
            cpu = next(
                (l.split(":", 1)[1].strip() for l in f if l.startswith("model name")),
                "",
            )
    return dict(
        cpu=cpu,
        cores=os.cpu_count(),
        load_average=list(os.getloadavg()),
        tensorflow=tf.__version__,
        keras=keras.__version__,
        **torch_versions,
    )


def _keras_seed(config, seed, batches, heal, calibration, validation, keep):
    """The maskfit arm of one seed: its runs, `{fraction: shrunk}` if `keep`, and
    the trained dense weights in Hugging Face's layout if `config.shared_dense`."""
    arch, optimizer, eager = config.architecture, config.optimizer, config.run_eagerly
    dense = keras_arm.build(arch, seed)
    keras_arm.train(dense, batches, optimizer, eager)
    trained = keras_arm.hf_weights(dense, arch) if config.shared_dense else None
    dense_params = dense.count_params()
    runs = [dict(arm="maskfit", schedule="dense", importance="-", fraction=0.0,
                 seed=seed, params=dense_params,
                 perplexity=keras_arm.perplexity(dense, validation))]  # fmt: skip
    kept = {0.0: dense} if keep else {}
    for schedule in config.schedules:
        for name in config.importances:
            for fraction in config.fractions:
                start = time.process_time()
                model = keras_arm.clone(dense, arch, seed)
                if schedule == "one_shot":
                    small = keras_arm.prune_one_shot(
                        model, name, fraction, calibration, config.round_to
                    )
                    keras_arm.train(small, heal, optimizer, eager)
                else:
                    small = keras_arm.prune_gradual(
                        model, name, fraction, calibration, config.round_to,
                        heal, optimizer, config.gradual_updates, eager,
                    )  # fmt: skip
                ppl = keras_arm.perplexity(small, validation)
                runs.append(
                    dict(arm="maskfit", schedule=schedule, importance=name,
                         fraction=fraction, seed=seed, params=small.count_params(),
                         removed=dense_params - small.count_params(), perplexity=ppl,
                         cpu_seconds=time.process_time() - start,
                         model=type(small).__name__)
                )  # fmt: skip
                logging.info("maskfit %s %s %.2f seed %d: ppl %.3f",
                             schedule, name, fraction, seed, ppl)  # fmt: skip
                if keep and schedule == "one_shot" and name == "magnitude":
                    kept[fraction] = small
    # The dense model given the healing steps too: the same total budget.
    keras_arm.train(dense, heal, optimizer, eager)
    runs.append(dict(runs[0], schedule="dense_healed",
                     perplexity=keras_arm.perplexity(dense, validation)))  # fmt: skip
    return runs, kept, trained


def _torch_seed(config, seed, batches, heal, validation, keep, trained=None):
    """The Torch-Pruning arm of one seed: its runs, and `{fraction: model}` if `keep`.

    With `trained` (Hugging Face weights), it starts from them instead of
    training its own dense model.
    """
    arch, optimizer = config.architecture, config.optimizer
    dense = torch_arm.build(arch, seed, trained)
    if trained is None:
        torch_arm.train(dense, batches, optimizer)
    dense_params = torch_arm.parameters(dense)
    runs = [dict(arm="torch_pruning", schedule="dense", importance="-", fraction=0.0,
                 seed=seed, params=dense_params,
                 perplexity=torch_arm.perplexity(dense, validation))]  # fmt: skip
    kept = {0.0: dense} if keep else {}
    for fraction in config.fractions:
        start = time.process_time()
        model = torch_arm.prune(copy.deepcopy(dense), fraction, config.round_to)
        torch_arm.train(model, heal, optimizer)
        params = torch_arm.parameters(model)
        runs.append(
            dict(arm="torch_pruning", schedule="one_shot", importance="magnitude",
                 fraction=fraction, seed=seed, params=params,
                 removed=dense_params - params,
                 perplexity=torch_arm.perplexity(model, validation),
                 cpu_seconds=time.process_time() - start)
        )  # fmt: skip
        if keep:
            kept[fraction] = model
    torch_arm.train(dense, heal, optimizer)
    runs.append(dict(runs[0], schedule="dense_healed",
                     perplexity=torch_arm.perplexity(dense, validation)))  # fmt: skip
    return runs, kept


def run(config, workdir):
    """Runs the experiment; writes its files under `workdir` and returns the metrics.

    Writes `config.json` (the config, the corpus's Python version and hash),
    `metrics.json` (machine, every run, latency rows, the summary, seconds),
    `transformer_pruning.md` (the tables) and `transformer_pruning.png`
    (perplexity against latency).
    """
    start, cpu_start = time.perf_counter(), time.process_time()
    if any(config.threads):
        latency.set_tensorflow_threads(*config.threads)
    os.makedirs(workdir, exist_ok=True)
    corpus = corpus_lib.load()
    absent = torch_arm.missing() if config.torch else ["--notorch"]
    if absent:
        logging.warning(
            "Skipping the Torch-Pruning arm: %s (it needs torch, transformers and"
            ' torch-pruning: pip install ".[benchmark]" after a CPU torch; see'
            " docs/transformer_pruning.md).",
            "--notorch" if not config.torch else "missing " + ", ".join(absent),
        )
    else:
        import torch

        torch.set_num_threads(1)
    common.write_json(
        os.path.join(workdir, "config.json"),
        dict(dataclasses.asdict(config), corpus=corpus.describe()),
    )
    validation = corpus.validation_windows(config.validation_windows, config.context)
    runs, keras_kept, torch_kept = [], {}, {}
    for index, seed in enumerate(config.seeds):
        windows = corpus.batches(
            config.train_steps + config.heal_steps, config.batch_size,
            config.context, seed,
        )  # fmt: skip
        batches, heal = windows[: config.train_steps], windows[config.train_steps :]
        calibration = heal.reshape(-1, heal.shape[-1])[: config.calibration]
        seed_runs, kept, trained = _keras_seed(
            config, seed, batches, heal, calibration, validation, keep=index == 0
        )
        runs += seed_runs
        keras_kept = kept or keras_kept
        if not absent:
            seed_runs, kept = _torch_seed(
                config, seed, batches, heal, validation, index == 0, trained
            )
            runs += seed_runs
            torch_kept = kept or torch_kept
    timings = timing.measure(
        keras_kept, torch_kept, config.latency_batches, config.context,
        corpus_lib.VOCABULARY, config.latency_rounds, config.latency_paths,
    )  # fmt: skip
    metrics = {
        "machine": _machine({} if absent else torch_arm.versions()),
        "torch_arm": "skipped: " + ", ".join(absent) if absent else "ran",
        "runs": runs,
        "latency": timings,
        "summary": report.summarize(runs),
        "seconds": time.perf_counter() - start,
        "cpu_seconds": time.process_time() - cpu_start,
    }
    common.write_json(os.path.join(workdir, "metrics.json"), metrics)
    with open(os.path.join(workdir, "transformer_pruning.md"), "w") as f:
        f.write(report.format_tables(metrics))
    report.plot(metrics, os.path.join(workdir, "transformer_pruning.png"))
    return metrics
