"""The finetune_recipes experiment as a library: `run(config, workdir)`.

Pretrains a small keras_hub GPT-2 on offline text (next byte), then fine-tunes
it to tell whether a snippet of standard-library source is code, a docstring
or a comment, with each recipe in turn, for several seeds: accuracy, learnable entries,
step time and peak memory against full fine-tuning.
"""

import concurrent.futures
import dataclasses
import multiprocessing
import os
import resource
import time

import keras
import numpy as np

import maskfit
from experiments import common
from experiments.common import training
from experiments.finetune_recipes import data, report
from maskfit.spec import recipes as recipes_lib
from maskfit.spec.declare import masked_layers

__all__ = ["METHODS", "Config", "run"]

METHODS = (
    "full",
    "head",
    "bitfit",
    "layerwise",
    "gradual",
    "sparse_1",
    "sparse_10",
    "lp_ft",
)


@dataclasses.dataclass(frozen=True)
class Config:
    """What one run does; every field is a flag of `python -m experiments.finetune_recipes`.

    Attributes:
      length: Bytes per snippet and per pretraining window.
      hidden_dim: Width of the GPT-2 backbone.
      num_layers: Transformer layers of the backbone.
      num_heads: Attention heads.
      intermediate_dim: Width of the feed-forward layers.
      pretrain_steps: Steps of next-byte pretraining.
      pretrain_learning_rate: AdamW learning rate of pretraining.
      batch_size: Batch size of pretraining and fine-tuning.
      train_per_class: Training snippets per class (small data).
      test_per_class: Test snippets per class (from other files).
      epochs: Fine-tuning epochs.
      learning_rate: AdamW learning rate of fine-tuning (every method).
      weight_decay: AdamW weight decay of fine-tuning.
      decay: Layer-wise learning-rate decay per block.
      sparse_steps: Steps of the short full pass that chooses sparse entries.
      seeds: Seeds; each method runs once per seed.
      methods: Methods to compare, 'full' among them: full, head, bitfit,
        layerwise, gradual, sparse_1, sparse_10, lp_ft.
      isolate: Run each method in a fresh process (its own peak memory).

    Example:
      >>> config = Config(seeds=(0,), methods=("full", "bitfit"))
    """

    length: int = 128
    hidden_dim: int = 64
    num_layers: int = 3
    num_heads: int = 4
    intermediate_dim: int = 128
    pretrain_steps: int = 4000
    pretrain_learning_rate: float = 2e-3
    batch_size: int = 32
    train_per_class: int = 64
    test_per_class: int = 150
    epochs: int = 10
    learning_rate: float = 2e-3
    weight_decay: float = 0.01
    decay: float = 0.7
    sparse_steps: int = 9
    seeds: tuple = (0, 1, 2)
    methods: tuple = METHODS
    isolate: bool = True

    def __post_init__(self):
        positive = [
            f.name
            for f in dataclasses.fields(self)
            if f.type is int and getattr(self, f.name) <= 0
        ]
        if positive:
            name = positive[0]
            raise ValueError(
                f"Received an invalid value for `{name}`, expected a positive"
                f" integer. Received: {name}={getattr(self, name)!r}"
            )
        for name in ("pretrain_learning_rate", "learning_rate"):
            if not getattr(self, name) > 0:
                raise ValueError(
                    f"Received an invalid value for `{name}`, expected a positive"
                    f" number. Received: {name}={getattr(self, name)!r}"
                )
        if not 0 < self.decay <= 1:
            raise ValueError(
                "Received an invalid value for `decay`, expected a number in"
                f" (0, 1]. Received: decay={self.decay!r}"
            )
        if self.weight_decay < 0:
            raise ValueError(
                "Received an invalid value for `weight_decay`, expected a number"
                f" >= 0. Received: weight_decay={self.weight_decay!r}"
            )
        unknown = [m for m in self.methods if m not in METHODS]
        if unknown or not self.methods or "full" not in self.methods:
            raise ValueError(
                f"Received an invalid value for `methods`, expected some of"
                f" {', '.join(METHODS)}, 'full' among them (the reference)."
                f" Received: methods={self.methods!r}"
            )
        if not self.seeds:
            raise ValueError("Received no `seeds`, expected at least one integer.")
        if self.hidden_dim % self.num_heads:
            raise ValueError(
                "Received `hidden_dim` not divisible by `num_heads`. Received:"
                f" hidden_dim={self.hidden_dim}, num_heads={self.num_heads}"
            )


def run(config, workdir):
    """Runs every method of `config` for every seed; writes everything under `workdir`.

    Writes `config.json`, `pretrained.weights.h5`, `metrics.json`,
    `results.md` (the table) and `results.png` (the figure).

    Returns:
      The metrics, as written to `metrics.json`.
    """
    wall, cpu = time.perf_counter(), time.process_time()
    os.makedirs(workdir, exist_ok=True)
    common.write_json(os.path.join(workdir, "config.json"), dataclasses.asdict(config))
    weights = os.path.join(workdir, "pretrained.weights.h5")
    pretrain_loss = _pretrain(config, weights)
    task = data.snippet_task(
        config.train_per_class, config.test_per_class, config.length, seed=0
    )
    methods = {}
    for method in config.methods:
        if config.isolate:  # a fresh process: its peak memory is this method's
            context = multiprocessing.get_context("spawn")
            with concurrent.futures.ProcessPoolExecutor(1, mp_context=context) as pool:
                methods[method] = pool.submit(
                    _method_runs, config, weights, method, task
                ).result()
        else:
            methods[method] = _method_runs(config, weights, method, task)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    metrics = {
        "pretrain_loss": pretrain_loss,
        "chance": 1 / len(data.CLASSES),
        "methods": report.summarize(methods),
        "wall_seconds": time.perf_counter() - wall,
        "cpu_seconds": time.process_time()
        - cpu
        + children.ru_utime
        + children.ru_stime,
    }
    common.write_json(os.path.join(workdir, "metrics.json"), metrics)
    report.write(metrics, workdir)
    return metrics


def _make_backbone(config):
    import keras_hub

    return keras_hub.models.GPT2Backbone(
        vocabulary_size=data.VOCABULARY,
        num_layers=config.num_layers,
        num_heads=config.num_heads,
        hidden_dim=config.hidden_dim,
        intermediate_dim=config.intermediate_dim,
        max_sequence_length=config.length,
        dropout=0.0,
    )


def _inputs(config):
    return {
        "token_ids": keras.Input((config.length,), dtype="int32", name="token_ids"),
        "padding_mask": keras.Input(
            (config.length,), dtype="int32", name="padding_mask"
        ),
    }


def _features(tokens):
    return {"token_ids": tokens, "padding_mask": np.ones_like(tokens)}


def _pretrain(config, path):
    """Next-byte prediction; saves the backbone's weights; returns the last loss."""
    keras.utils.set_random_seed(1234)
    backbone = _make_backbone(config)
    inputs = _inputs(config)
    logits = backbone.token_embedding(backbone(inputs), reverse=True)
    model = keras.Model(inputs, logits)
    model.compile(
        optimizer=keras.optimizers.AdamW(config.pretrain_learning_rate),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    windows = data.pretraining_windows(
        config.pretrain_steps * config.batch_size, config.length, seed=1
    )
    history = model.fit(
        _features(windows[:, :-1]),
        windows[:, 1:],
        batch_size=config.batch_size,
        epochs=1,
        verbose=0,
    )
    backbone.save_weights(path)
    return float(history.history["loss"][-1])


def _method_runs(config, weights, method, task):
    """Every seed of one method: `{"runs": [...], "peak_rss_mb": ...}`."""
    runs = [_finetune(config, weights, method, seed, task) for seed in config.seeds]
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"runs": runs, "peak_rss_mb": peak if config.isolate else None}


def _finetune(config, weights, method, seed, task):
    x_train, y_train, x_test, y_test = task
    keras.utils.set_random_seed(seed)
    backbone = _make_backbone(config)
    backbone.load_weights(weights)
    inputs = _inputs(config)
    pooled = keras.layers.GlobalAveragePooling1D()(backbone(inputs))
    head = keras.layers.Dense(len(data.CLASSES), name="head")
    model = maskfit.MaskedModel(inputs, head(pooled))
    model.compile(
        optimizer=keras.optimizers.AdamW(
            config.learning_rate, weight_decay=config.weight_decay
        ),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    steps = config.epochs * -(-len(y_train) // config.batch_size)
    # Before any mask: MaskedModel.trainable_weights leaves out frozen ones.
    variables = list(model.trainable_weights)
    x = _features(x_train)
    _declare(config, method, model, head, steps, x, y_train)
    times = training.StepTimes()
    model.fit(
        x,
        y_train,
        batch_size=config.batch_size,
        epochs=config.epochs,
        verbose=0,
        callbacks=[times],
    )
    _, accuracy = model.evaluate(_features(x_test), y_test, verbose=0)
    return {
        "seed": seed,
        "accuracy": float(accuracy),
        "learnable": _learnable(model, variables),
        "total": int(sum(np.prod(v.shape) for v in variables)),
        "step_ms": 1000 * float(np.median(times.seconds[2:] or times.seconds)),
    }


def _declare(config, method, model, head, steps, x, y):
    head_only = r"^head/"
    if method == "head":
        maskfit.train_only(model, head_only)
    elif method == "bitfit":  # biases, and the new head (as in the paper)
        maskfit.train_only(model, [*recipes_lib.BIAS_PATTERNS, head_only])
    elif method == "layerwise":
        maskfit.layerwise_decay(model, config.decay)
    elif method == "gradual":  # one block more every so often; all by mid-run
        blocks = len(maskfit.layerwise_depths(model))
        maskfit.layerwise_decay(
            model, 1.0, unfreeze_every=max(1, steps // (2 * blocks))
        )
    elif method.startswith("sparse_"):
        fraction = int(method.split("_")[1]) / 100
        maskfit.sparse_finetune(
            model,
            x,
            y,
            k=fraction,
            steps=config.sparse_steps,
            batch_size=config.batch_size,
        )
    elif method == "lp_ft":
        maskfit.probe_then_finetune(model, head, switch_step=max(1, steps // 2))


def _learnable(model, variables):
    """Entries whose mask is above 0 at the end of training (all without a mask)."""
    masked = {}
    for layer, spec in masked_layers(model):
        final = spec.schedule()[1][-1]
        for v, m, _ in final.resolve(layer):
            masked[id(v)] = int(np.count_nonzero(np.broadcast_to(m, v.shape)))
    return int(sum(masked.get(id(v), np.prod(v.shape)) for v in variables))
