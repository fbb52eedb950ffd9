"""Step time of a mask rule that updates every `delta_t` steps, against a static mask.

Issue 25 asks that, averaged over a run with `delta_t = 100`, a RigL step
costs at most 1.05 of a static-mask step. Each contender trains the same
ReLU MLP (`depth` Dense layers of `width` units, then Dense(10)) with AdamW
on one fixed batch, at `sparsity`, with the same per-layer sparsities
(`maskfit.sparse.allocate`, ERK by default):

- `dense`: no mask (a reference, not a contender);
- `static`: the seed's random masks as `ElementMask`s (the baseline);
- `pruning`: `prune_low_magnitude` with `ConstantSparsity(layer sparsity,
  begin_step=0, frequency=delta_t)`: magnitude masks recomputed every
  `delta_t` steps for ever, the nearest rule maskfit runs today;
- `set`, `rigl`: `maskfit.sparse.sparsify` with SET or RigL (constant drop
  fraction `alpha`, `t_end` beyond the run), updating every `delta_t` steps.

A timed round is `rounds_of` x `delta_t` steps, so every round of every
contender holds the same number of update steps. Contenders are built and
warmed up once, then timed round-robin, order rotating, `repeats` times;
each ratio is taken per round against `static` and the median reported, as
in `benchmarks.harness`.
"""

import dataclasses

import keras
import numpy as np

import maskfit
from benchmarks import harness
from maskfit import pruning, sparse

COLUMNS = (
    "mode",
    "contender",
    *harness.RATIO_COLUMNS,
    "updates_per_round",
)
BASELINE = "static"


@dataclasses.dataclass
class Config(
    harness.TimingConfig,
    steps=None,
    steps_per_execution=20,
    warmup_steps=200,
    repeats=7,
):
    """What to measure; `delta_t=100` is the issue's.

    The fields of `harness.TimingConfig` but `steps` (a round is `rounds_of`
    update periods), and:

    Attributes:
      contenders: From dense, static, pruning, set, rigl (`CONTENDERS`).
      modes: graph, jit.
      depth: Hidden Dense layers.
      width: Units per hidden layer.
      batch: Batch size.
      sparsity: Target sparsity.
      sparsity_distribution: uniform, erdos_renyi or erdos_renyi_kernel (ERK).
      delta_t: Steps between updates.
      alpha: Initial drop fraction of SET and RigL.
      rounds_of: Update periods per timed round.
    """

    contenders: tuple = ("dense", "static", "pruning", "set", "rigl")
    modes: tuple = ("graph", "jit")
    depth: int = 3
    width: int = 1024
    batch: int = 256
    sparsity: float = 0.9
    sparsity_distribution: str = "erdos_renyi_kernel"
    delta_t: int = 100
    alpha: float = 0.3
    rounds_of: int = 2

    def __post_init__(self):
        self.contenders = tuple(self.contenders)
        unknown = [c for c in self.contenders if c not in CONTENDERS]
        if unknown:
            raise ValueError(
                f"Unknown contenders {unknown}; expected names from {tuple(CONTENDERS)}."
            )
        if BASELINE not in self.contenders:
            raise ValueError(f"The contenders must include {BASELINE!r}, the baseline.")
        if self.delta_t % self.steps_per_execution:
            raise ValueError(
                f"steps_per_execution ({self.steps_per_execution}) must divide delta_t"
                f" ({self.delta_t}), so that rounds hold whole update periods."
            )


def _static(model, entries, config):
    for entry, keep in zip(entries, sparse.random_keep_masks(entries, config.seed)):
        entry.variable.assign(np.where(keep, entry.variable.numpy(), 0))
        maskfit.set_mask(entry.layer, maskfit.ElementMask({"kernel": keep}))


def _pruning(model, entries, config):
    for entry in entries:
        if entry.sparsity > 0:
            schedule = pruning.ConstantSparsity(
                entry.sparsity, begin_step=0, frequency=config.delta_t
            )
            pruning.prune_low_magnitude(entry.layer, pruning_schedule=schedule)


def _dynamic(method):
    def declare(model, entries, config):
        sparse.sparsify(
            model,
            method,
            config.sparsity,
            t_end=10**9,
            delta_t=config.delta_t,
            alpha=config.alpha,
            drop_fraction_anneal="constant",
            sparsity_distribution=config.sparsity_distribution,
            seed=config.seed,
        )

    return declare


# name -> declare(model, allocation, config); a new contender is one entry.
CONTENDERS = {
    "dense": lambda model, entries, config: None,
    "static": _static,
    "pruning": _pruning,
    "set": _dynamic("set"),
    "rigl": _dynamic("rigl"),
}


def _contender(config, mode, name):
    keras.utils.set_random_seed(config.seed)
    inputs = keras.Input((config.width,))
    hidden = inputs
    for index in range(config.depth):
        hidden = keras.layers.Dense(
            config.width, activation="relu", name=f"dense_{index + 1}"
        )(hidden)
    outputs = keras.layers.Dense(10, name="head")(hidden)
    model = maskfit.MaskedModel(inputs, outputs, name="mlp")
    entries = sparse.allocate(model, config.sparsity, config.sparsity_distribution)
    CONTENDERS[name](model, entries, config)
    model.compile(
        optimizer=keras.optimizers.AdamW(learning_rate=1e-4, weight_decay=0.004),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        jit_compile=mode == "jit",
        steps_per_execution=config.steps_per_execution,
    )
    rng = np.random.default_rng(config.seed)
    x = rng.standard_normal((config.batch, config.width)).astype(np.float32)
    y = rng.integers(0, 10, size=(config.batch,)).astype(np.int32)
    steps = config.rounds_of * config.delta_t
    return harness.Timed.of_config(name, model, x, y, config, steps)


def _measure(config, mode):
    contenders = [_contender(config, mode, name) for name in config.contenders]
    times, cpu_times = harness.round_robin(contenders, config.repeats)
    rows = []
    for contender in contenders:
        rows.append(
            {
                "mode": mode,
                "contender": contender.key,
                **harness.ratio_row(times, cpu_times, contender.key, BASELINE),
                "updates_per_round": (
                    0 if contender.key in ("dense", "static") else config.rounds_of
                ),
            }
        )
        harness.log_ratio_row(
            f"{mode} {contender.key}", rows[-1], ratio="over static", ms_digits=3
        )
    return rows


def format_table(rows):
    """Returns `rows` as a Markdown table."""
    lines = [
        "| mode | contender | ms/step | over static (median) | spread | CPU ratio |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for row in rows:
        lines.append(
            f"| {row['mode']} | {row['contender']} | {row['step_ms']:.3f} |"
            f" {row['ratio_median']:.3f} | [{row['ratio_min']:.3f},"
            f" {row['ratio_max']:.3f}] | {row['cpu_ratio_median']:.3f} |"
        )
    return "\n".join(lines) + "\n"


def run(config, workdir):
    """Times every contender in every mode; writes `sparse_step_time.{json,csv,md}`.

    Returns:
      The rows, dicts with the keys of `COLUMNS`.
    """
    harness.write_config(workdir, config)
    rows = [row for mode in config.modes for row in _measure(config, mode)]
    harness.write_json(
        workdir, "sparse_step_time.json", {"machine": harness.machine(), "rows": rows}
    )
    harness.write_csv(workdir, "sparse_step_time.csv", rows, COLUMNS)
    harness.write_text(workdir, "sparse_step_time.md", format_table(rows))
    return rows
