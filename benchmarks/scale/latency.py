"""The 1.1B prune/shrink/latency measurement: one-shot half, shrunk against dense.

`python -m benchmarks.scale.latency --workdir DIR [--size=1.1B]` builds a
keras_hub `LlamaCausalLM` at one of `lib.SIZES`, removes half its heads (by
key/value group) and FFN units with `select_units(0.5)`, shrinks it with
`shrink(uniform=True)` (a `MistralCausalLM`), checks the shrunk logits
against the masked model's (the largest difference over the logits' scale),
then times a forward pass of each at `tokens` tokens, per batch size and
dtype (float32, bfloat16: the same weights cast), each compiled
(`predict_on_batch`) and timed as the median of `repeats` calls. It writes
`latency.json` and prints the table; on a GPU it measures what issue 43's
H200 row reports (`benchmarks/gpu.sh` runs it).
"""

import dataclasses
import time

import keras
import numpy as np

import maskfit.pruning as pruning
from benchmarks import harness
from benchmarks.scale import lib, measure


@dataclasses.dataclass
class Config:
    """What to measure.

    Attributes:
      size: A name of `benchmarks.scale.lib.SIZES`.
      tokens: Tokens per example.
      batches: Batch sizes timed.
      dtypes: Dtypes timed (float32, bfloat16).
      repeats: Timed calls per case (the median is reported).
    """

    size: str = "1.1B"
    tokens: int = 128
    batches: tuple = (1, 16)
    dtypes: tuple = ("float32", "bfloat16")
    repeats: int = 10

    def __post_init__(self):
        self.batches, self.dtypes = tuple(self.batches), tuple(self.dtypes)
        if self.size not in lib.SIZES:
            raise ValueError(
                f"Config size must be one of {sorted(lib.SIZES)}. Received: {self.size!r}"
            )
        unknown = set(self.dtypes) - {"float32", "bfloat16"}
        if unknown or not self.batches or min(self.batches) < 1 or self.repeats < 1:
            raise ValueError(
                "Config needs batches >= 1, repeats >= 1 and dtypes from float32,"
                f" bfloat16. Received: batches={self.batches!r},"
                f" dtypes={self.dtypes!r}, repeats={self.repeats!r}"
            )


def _in_dtype(model, dtype):
    """`model` (a keras_hub CausalLM) rebuilt in `dtype` with its weights cast."""
    backbone = type(model.backbone).from_config(
        {**model.backbone.get_config(), "dtype": dtype}
    )
    made = type(model)(backbone=backbone, preprocessor=None)
    for target, source in zip(made.weights, model.weights):
        target.assign(keras.ops.cast(source, target.dtype))
    return made


def _latency(model, batch, repeats):
    model.predict_on_batch(batch)  # compiled here
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        keras.ops.convert_to_numpy(model.predict_on_batch(batch))
        times.append(time.perf_counter() - start)
    return float(np.median(times))


def _masked_logits(model, selection, batch):
    """The model's logits with the removed entries set to 0 (then put back)."""
    graph, saved = selection.graph, []
    for entry in graph.sliced_variables():
        value = np.asarray(keras.ops.convert_to_numpy(entry.variable))
        keep = np.ones(value.shape, bool)
        for axis, ids in entry.axes.items():
            shape = [1] * value.ndim
            shape[axis] = -1
            keep &= graph.kept_positions(ids, selection.kept).reshape(shape)
        saved.append((entry.variable, value))
        entry.variable.assign(np.where(keep, value, 0).astype(value.dtype))
    try:
        return np.asarray(model.predict_on_batch(batch), np.float64)
    finally:
        for variable, value in saved:
            variable.assign(value)


def run(config, workdir):
    """Prunes, shrinks and times; writes `latency.json`; returns the summary."""
    harness.write_config(workdir, config)
    size = lib.size_config(config.size, config.tokens)
    dense = measure.build(size)
    selection = pruning.select_units(dense, 0.5)
    small = pruning.shrink(dense, selection, uniform=True)
    rng = np.random.default_rng(0)
    probe = measure.tokens(size, 1, rng)
    expected = _masked_logits(dense, selection, probe)
    got = np.asarray(small.predict_on_batch(probe), np.float64)
    rows = []
    for dtype in config.dtypes:
        pair = (
            [dense, small]
            if dtype == "float32"
            else [_in_dtype(dense, dtype), _in_dtype(small, dtype)]
        )
        for batch_size in config.batches:
            batch = measure.tokens(size, batch_size, rng)
            dense_s, small_s = (_latency(m, batch, config.repeats) for m in pair)
            rows.append(
                {
                    "dtype": dtype,
                    "batch": batch_size,
                    "dense_ms": 1e3 * dense_s,
                    "shrunk_ms": 1e3 * small_s,
                    "ratio": small_s / dense_s,
                }
            )
    summary = {
        "machine": harness.machine(),
        "class": type(small).__name__,
        "params": int(dense.count_params()),
        "shrunk_params": int(small.count_params()),
        "logits_error": float(
            np.max(np.abs(got - expected)) / np.max(np.abs(expected))
        ),
        "rows": rows,
    }
    harness.write_json(workdir, "latency.json", summary)
    return summary


def format_table(summary):
    """Markdown: the shrink's result, then one row per dtype and batch."""
    lines = [
        f"{summary['params'] / 1e9:.2f}B -> {summary['shrunk_params'] / 1e9:.2f}B"
        f" parameters ({summary['class']}); shrunk logits within"
        f" {summary['logits_error']:.1e} of the masked model's scale",
        "",
        "| dtype | batch | dense ms | shrunk ms | shrunk/dense |",
        "|---|---|---|---|---|",
    ]
    for row in summary["rows"]:
        lines.append(
            f"| {row['dtype']} | {row['batch']} | {row['dense_ms']:.2f} |"
            f" {row['shrunk_ms']:.2f} | {row['ratio']:.3f} |"
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    from absl import app

    from experiments.common import cli

    app.run(
        cli.config_main(Config, run, workdir="runs/scale_latency", table=format_table)
    )
