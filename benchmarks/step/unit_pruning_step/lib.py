"""The training step while units are being pruned, against an unpruned step.

Contenders, timed in turn on one MLP (the sizes of issue #23: 64-1024-1024-10)
with one fixed batch, Adam, and each other's weights:

- `keras`: stock `keras.Model.fit`, no pruning (the baseline);
- `masked`: `maskfit.MaskedModel` without masks (what maskfit's step adds);
- `units`: `maskfit.pruning.prune_units` with a schedule that keeps pruning
  (toward 50% of each layer's units, every `frequency` steps, never ending),
  so the step runs the rule's check every step and re-scores every
  `frequency` steps, on the dense shapes: the training step while units
  are being pruned, what the issue bounds at 1.10 of an unpruned step;
- `units_each_step`: the same, re-scoring in every step (frequency 1): the
  cost of an update step itself, an upper bound for any frequency.

Each round runs `steps` steps of every contender, in rotating order; the
table gives the median step time and the median of the per-round ratios to
`keras`.
"""

import dataclasses
import os

import keras
import numpy as np

import maskfit
from benchmarks import harness

CONTENDERS = ("keras", "masked", "units", "units_each_step")


@dataclasses.dataclass(frozen=True)
class Config(
    harness.TimingConfig, steps=50, steps_per_execution=1, warmup_steps=5, repeats=10
):
    """What to measure: one MLP's step while its units are pruned.

    The timing fields and `seed` of `harness.TimingConfig`, and:

    Attributes:
      widths: Units of the input, each hidden layer and the output.
      batch: Batch size.
      frequency: Steps between two pruning updates.
      jit_compile: Compile the step with XLA.
    """

    widths: tuple = (64, 1024, 1024, 10)
    batch: int = 64
    frequency: int = 10
    jit_compile: bool = False


def _model(config, kind):
    keras.utils.set_random_seed(config.seed)
    inputs = keras.Input((config.widths[0],))
    x = inputs
    for i, width in enumerate(config.widths[1:-1]):
        x = keras.layers.Dense(width, activation="relu", name=f"hidden{i}")(x)
    outputs = keras.layers.Dense(config.widths[-1], name="head")(x)
    if kind == "keras":
        return keras.Model(inputs, outputs)
    model = maskfit.MaskedModel(inputs, outputs)
    if kind.startswith("units"):
        frequency = 1 if kind == "units_each_step" else config.frequency
        schedule = maskfit.pruning.PolynomialDecay(
            0.0, 0.5, begin_step=0, end_step=10**7, frequency=frequency
        )
        model = maskfit.pruning.prune_units(model, schedule)
    return model


def _timed(config, kind):
    model = _model(config, kind)
    model.compile(
        optimizer=keras.optimizers.Adam(1e-3),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        jit_compile=config.jit_compile,
        steps_per_execution=config.steps_per_execution,
    )
    rng = np.random.default_rng(config.seed)
    x = rng.normal(size=(config.batch, config.widths[0])).astype("float32")
    y = rng.integers(0, config.widths[-1], size=(config.batch,))
    return harness.Timed.of_config(kind, model, x, y, config)


def run(config, workdir):
    """Times the contenders; writes `unit_pruning_step.json` under `workdir`."""
    os.makedirs(workdir, exist_ok=True)
    contenders = [_timed(config, kind) for kind in CONTENDERS]
    times, cpu = harness.round_robin(contenders, config.repeats)
    rows = []
    for kind in CONTENDERS:
        median, low, high = harness.paired_ratios(times, kind, "keras")
        rows.append(
            {
                "contender": kind,
                "step_ms": 1000 * float(np.median(times[kind])),
                "ratio_median": median,
                "ratio_min": low,
                "ratio_max": high,
                "cpu_ratio_median": harness.paired_ratios(cpu, kind, "keras")[0],
            }
        )
    result = {
        "config": dataclasses.asdict(config),
        "machine": harness.machine(),
        "rows": rows,
    }
    harness.write_json(workdir, "unit_pruning_step.json", result)
    return rows


def format_table(rows):
    lines = ["contender        step_ms  ratio (min-max)       cpu_ratio"]
    for r in rows:
        lines.append(
            f"{r['contender']:<15}  {r['step_ms']:7.3f}  {r['ratio_median']:.3f}"
            f" ({r['ratio_min']:.3f}-{r['ratio_max']:.3f})  {r['cpu_ratio_median']:.3f}"
        )
    return "\n".join(lines)
