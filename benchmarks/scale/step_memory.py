"""Peak memory a masked TensorFlow training step adds over stock Keras's step.

Issue 43: a graph-mode `MaskedModel` step (`train_on_batch`, no
`jit_compile`) must hold no more than stock Keras's: no float32 per
parameter more. For each model and optimizer, stock `keras.Model` and
`MaskedModel` (an `ElementMask` on every kernel, the first half of its rows
frozen) each run in a process of their own, so that their peaks do not mix,
and report the peak resident memory (`/proc/self/status` `VmHWM`, reset
before each step, as `benchmarks.scale.measure` reads it) that the first
step (which traces the step) and a later step (the median over steps 2 to
`steps`) add over what the process held just before it; oneDNN's CPU
kernels are off in those processes, whose allocator would keep every freed
buffer (`in_subprocess`). The models: `mlp`, `mlp_depth` `Dense(mlp_width)` layers
under a `Dense(classes)` head; and any size of `benchmarks.scale` (a
keras_hub Llama: `112M`, `365M`, ...).

Run it as `python -m benchmarks.scale.step_memory --workdir /tmp/step_memory`
(add e.g. `--models=mlp,365M`); it prints one table and writes
`step_memory.json` to the workdir.
"""

import dataclasses
import json
import sys

import keras
import numpy as np

import maskfit
from benchmarks import harness
from benchmarks.scale import lib as scale_lib
from benchmarks.scale import measure

CONTENDERS = ("stock", "masked")


@dataclasses.dataclass
class Config:
    """What to measure.

    Attributes:
      models: mlp, or sizes of benchmarks.scale (a keras_hub Llama, e.g. 365M).
      optimizers: adamw, sgd.
      mlp_depth: Hidden Dense layers of the MLP.
      mlp_width: Units per MLP layer (and its input width).
      mlp_batch: MLP batch size.
      classes: Classes of the MLP's head.
      sequence: Tokens per example (batch 1) of the Llama.
      steps: Steps taken; a later step's peak is the median over all but the first.
    """

    models: tuple = ("mlp",)
    optimizers: tuple = ("sgd", "adamw")
    mlp_depth: int = 4
    mlp_width: int = 4096
    mlp_batch: int = 32
    classes: int = 10
    sequence: int = 16
    steps: int = 6

    def __post_init__(self):
        self.models = tuple(self.models)
        self.optimizers = tuple(self.optimizers)
        unknown = [m for m in self.models if m != "mlp" and m not in scale_lib.SIZES]
        if unknown or not self.models:
            raise ValueError(
                "Config models must name mlp or sizes of benchmarks.scale"
                f" ({sorted(scale_lib.SIZES)}). Received: {self.models!r}"
            )
        if not self.optimizers or set(self.optimizers) - {"adamw", "sgd"}:
            raise ValueError(
                f"Config optimizers must be adamw or sgd. Received: {self.optimizers!r}"
            )
        if isinstance(self.steps, bool) or int(self.steps) < 2:
            raise ValueError(f"Config steps must be >= 2. Received: {self.steps!r}")


def _mlp(case, masked):
    """The MLP of `case` and one batch `(x, y)`; its kernels masked if `masked`."""
    keras.utils.set_random_seed(0)
    width = case["mlp_width"]
    inputs = keras.Input((width,))
    hidden = inputs
    layers = [
        keras.layers.Dense(width, activation="relu") for _ in range(case["mlp_depth"])
    ]
    layers.append(keras.layers.Dense(case["classes"]))
    for layer in layers:
        hidden = layer(hidden)
    if masked:
        for layer in layers:
            keep = np.ones(tuple(layer.kernel.shape), bool)
            keep[: keep.shape[0] // 2] = False
            maskfit.set_mask(layer, maskfit.ElementMask({"kernel": keep}))
    model = (maskfit.MaskedModel if masked else keras.Model)(inputs, hidden)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((case["mlp_batch"], width)).astype(np.float32)
    y = rng.integers(0, case["classes"], size=(case["mlp_batch"],)).astype(np.int32)
    return model, (x, y)


def _llama(case, masked):
    """The Llama of `case` (a `scale_lib.size_config`) and one batch of tokens."""
    lm = measure.build(case["size"])
    if masked:
        measure.declare(lm)
    model_class = maskfit.MaskedModel if masked else keras.Model
    batch = measure.tokens(case["size"], 1, np.random.default_rng(0))
    return model_class(lm.inputs, lm.outputs), (batch, batch["token_ids"])


def measure_case(case):
    """One contender in this process: the peak its first and a later step add.

    Args:
      case: a dict: `contender` ("stock" or "masked"), `optimizer`,
        `steps`, and either `model="mlp"` with the `mlp_*` and
        `classes` fields of `Config`, or `model="llama"` with `size`
        (`benchmarks.scale.lib.size_config`).

    Returns:
      A dict: `weights_bytes` (the trainable weights), `first` and `later`
      (the peak bytes the step added over the memory held before it; None
      where the peak cannot be reset).
    """
    masked = case["contender"] == "masked"
    build = _mlp if case["model"] == "mlp" else _llama
    model, (x, y) = build(case, masked)
    model.compile(
        optimizer=harness.optimizer(case["optimizer"]),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    phases = measure.Phases()
    for step in range(case["steps"]):
        phases.run(step, lambda: model.train_on_batch(x, y))
    peaks = [phases.rows[step]["peak_added_bytes"] for step in range(case["steps"])]
    weights = sum(
        int(np.prod(v.shape)) * np.dtype(v.dtype).itemsize
        for v in model.trainable_weights
    )
    return {
        "weights_bytes": weights,
        "first": peaks[0],
        "later": None if None in peaks else float(np.median(peaks[1:])),
    }


def cases(config):
    """`(model, optimizer, contender, case)` for every process to run."""
    found = []
    for model in config.models:
        if model == "mlp":
            shape = {
                "model": "mlp",
                "mlp_depth": config.mlp_depth,
                "mlp_width": config.mlp_width,
                "mlp_batch": config.mlp_batch,
                "classes": config.classes,
            }
        else:
            size = scale_lib.size_config(model, config.sequence)
            shape = {"model": "llama", "size": size}
        for optimizer in config.optimizers:
            for contender in CONTENDERS:
                case = dict(
                    shape,
                    optimizer=optimizer,
                    contender=contender,
                    steps=config.steps,
                )
                found.append((model, optimizer, contender, case))
    return found


def in_subprocess(cases):
    """`measure_case` of each of `cases`, in turn, in one new Python process.

    The benchmark runs one case per process; a test may run several in one,
    to pay the imports once (a case's peaks are taken over the memory held
    before each step, so that what an earlier case left behind is not counted,
    but a runtime it warmed up may lower a later case's first step).

    Returns:
      The list of their results.
    """
    # A buffer the step frees must leave the resident memory, or a later
    # step's peak reads as ~0: oneDNN's CPU allocator caches freed buffers
    # (its pool only grows), and glibc keeps freed large ones once it has
    # raised its mmap threshold. Both off: each step's peak is its own.
    return scale_lib.result_of(
        "benchmarks.scale.step_memory",
        ["cases", json.dumps(list(cases))],
        f"cases {cases!r}",
        TF_ENABLE_ONEDNN_OPTS="0",
        MALLOC_MMAP_THRESHOLD_="131072",
    )


def run(config, workdir):
    """Measures every contender, each in its own process; writes step_memory.json.

    Returns:
      One row per (model, optimizer): `weights_bytes`, and per contender the
      bytes its first and later step added (`stock_first`, `masked_later`, ...).
    """
    harness.write_config(workdir, config)
    rows = {}
    for model, optimizer, contender, case in cases(config):
        (found,) = in_subprocess([case])
        row = rows.setdefault(
            (model, optimizer),
            {"model": model, "optimizer": optimizer, "weights_bytes": 0},
        )
        row["weights_bytes"] = found["weights_bytes"]
        row[f"{contender}_first"] = found["first"]
        row[f"{contender}_later"] = found["later"]
    rows = list(rows.values())
    harness.write_json(
        workdir, "step_memory.json", {"machine": harness.machine(), "rows": rows}
    )
    return rows


def _mb(value):
    return "-" if value is None else f"{value / 2**20:.0f}"


def format_table(rows):
    """Markdown: per model and optimizer, the MB each step added, and masked - stock."""
    lines = [
        "| model | optimizer | weights MB | first step: stock | masked | masked - stock"
        " | later step: stock | masked | masked - stock |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        cells = [row["model"], row["optimizer"], _mb(row["weights_bytes"])]
        for step in ("first", "later"):
            stock, masked = row[f"stock_{step}"], row[f"masked_{step}"]
            over = None if None in (stock, masked) else masked - stock
            cells += [_mb(stock), _mb(masked)]
            cells.append(
                "-"
                if over is None
                else f"{_mb(over)} ({over / row['weights_bytes']:.2f}x weights)"
            )
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    if sys.argv[1:2] == ["cases"]:
        found = [measure_case(case) for case in json.loads(sys.argv[2])]
        print("RESULT " + json.dumps(found), flush=True)
    else:
        from absl import app

        from experiments.common import cli

        app.run(
            cli.config_main(Config, run, workdir="runs/step_memory", table=format_table)
        )
