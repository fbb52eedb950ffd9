"""Layer-wise learning-rate decay: multipliers on one optimizer against a MultiOptimizer.

A stack of `blocks` Dense layers (the last one the head, at depth 0) trains
with AdamW (weight decay, a cosine schedule) where block d learns at the
learning rate x decay**d, four ways, on one fixed batch, in one process:

- `keras`: stock `keras.Model`, one AdamW, no decay (the floor: what a step
  costs without per-block rates);
- `multi_optimizer`: stock `keras.Model` with `keras.optimizers.MultiOptimizer`
  holding one AdamW per block at the schedule x decay**d (Keras 3.15+);
- `maskfit`: `maskfit.MaskedModel` with `maskfit.layerwise_decay` and one AdamW:
  what users run;
- `rates_step`: stock `keras.Model` whose optimizer applies its update under
  `maskfit.optim.rates.scaled_learning_rates` (the mechanism alone,
  without the masking stage).

All start from the same weights. The contenders are timed round-robin for
`repeats` rounds (`benchmarks.harness`); afterwards all have taken the same
steps, and the weights of each are compared with `multi_optimizer`'s.
"""

import dataclasses
import logging
import statistics

import keras
import numpy as np

import maskfit
from benchmarks import harness
from maskfit.optim.rates import scaled_learning_rates

CONTENDERS = ("keras", "multi_optimizer", "maskfit", "rates_step")
COLUMNS = (
    "contender",
    "mode",
    "step_ms",
    "ratio_to_keras",
    "ratio_to_multi_optimizer",
    "ratio_spread",
    "max_abs_diff",
    "distance",
    "agrees",
)


@dataclasses.dataclass(frozen=True)
class Config(harness.TimingConfig):
    """What to measure.

    The timing fields and `seed` of `harness.TimingConfig`, and:

    Attributes:
      blocks: Dense blocks, the head included.
      width: Units per block.
      batch: Batch size.
      classes: Classes of the data.
      decay: Learning-rate factor per block.
      learning_rate: AdamW's learning rate (of the head).
      weight_decay: AdamW's weight decay.
      decay_steps: Steps of the learning-rate schedule's decay.
      modes: Modes: graph, jit.
      tolerance: Largest relative difference from MultiOptimizer's weights.
    """

    blocks: int = 12
    width: int = 256
    batch: int = 128
    classes: int = 10
    decay: float = 0.8
    learning_rate: float = 1e-3
    weight_decay: float = 0.05
    decay_steps: int = 1000
    modes: tuple = ("graph", "jit")
    # Agreement: for every variable, |w - w_multi| / |w_multi - w_start| below
    # this. Rounding amplified over the run's ~200 AdamW steps reached 0.02 in
    # graph mode (0 under XLA, same bits); other rates per block give 5.
    tolerance: float = 0.1

    def __post_init__(self):
        if self.blocks < 2:
            raise ValueError(
                f"`blocks` must be at least 2. Received: blocks={self.blocks}"
            )
        if not 0 < self.decay <= 1:
            raise ValueError(f"`decay` must be in (0, 1]. Received: decay={self.decay}")
        unknown = set(self.modes) - {"graph", "jit"}
        if unknown:
            raise ValueError(
                f"`modes` must be 'graph' or 'jit'. Received: {self.modes}"
            )


class ScaledSchedule(keras.optimizers.schedules.LearningRateSchedule):
    """`schedule(step) * factor`: one block's learning rate."""

    def __init__(self, schedule, factor):
        self.schedule = schedule
        self.factor = factor

    def __call__(self, step):
        return self.schedule(step) * self.factor


def _schedule(config):
    return keras.optimizers.schedules.CosineDecay(
        config.learning_rate, config.decay_steps
    )


def _adamw(config, factor=1.0):
    schedule = _schedule(config)
    if factor != 1.0:
        schedule = ScaledSchedule(schedule, factor)
    return keras.optimizers.AdamW(schedule, weight_decay=config.weight_decay)


def _stack(config, model_class):
    """`blocks` Dense layers named block_0 (input side) ... block_{n-1} (the head)."""
    inputs = keras.Input((config.width,))
    hidden = inputs
    for i in range(config.blocks - 1):
        hidden = keras.layers.Dense(config.width, activation="relu", name=f"block_{i}")(
            hidden
        )
    outputs = keras.layers.Dense(config.classes, name=f"block_{config.blocks - 1}")(
        hidden
    )
    return model_class(inputs, outputs)


def _factors(config):
    """`{block index: decay**depth}`, depth 0 for the head."""
    return {i: config.decay ** (config.blocks - 1 - i) for i in range(config.blocks)}


def _multi_optimizer(config):
    if not hasattr(keras.optimizers, "MultiOptimizer"):
        return None
    factors = _factors(config)
    head = config.blocks - 1
    optimizer_map = keras.optimizers.OptimizerMap(
        _adamw(config, factors[head]),
        {f"block_{i}/.*": _adamw(config, f) for i, f in factors.items() if i != head},
    )
    return keras.optimizers.MultiOptimizer(optimizer_map)


def _rates_step_optimizer(config, model):
    """One AdamW whose `apply` runs under `scaled_learning_rates` (as the step will)."""
    optimizer = _adamw(config)
    factors = _factors(config)
    pairs = [
        (v, factors[i])
        for i in range(config.blocks)
        for v in model.get_layer(f"block_{i}").trainable_weights
        if factors[i] != 1.0
    ]
    apply = optimizer.apply

    def apply_scaled(grads, trainable_variables=None):
        with scaled_learning_rates(optimizer, pairs):
            return apply(grads, trainable_variables)

    optimizer.apply = apply_scaled
    return optimizer


def _model(config, name):
    """The model and optimizer of contender `name`, or None where this Keras lacks it."""
    keras.utils.set_random_seed(config.seed)
    if name == "maskfit":
        model = _stack(config, maskfit.MaskedModel)
        maskfit.layerwise_decay(model, config.decay)
        return model, _adamw(config)
    model = _stack(config, keras.Model)
    if name == "keras":
        return model, _adamw(config)
    if name == "multi_optimizer":
        optimizer = _multi_optimizer(config)
        return (model, optimizer) if optimizer is not None else None
    if name == "rates_step":
        return model, _rates_step_optimizer(config, model)
    raise ValueError(f"Unknown contender {name!r}; expected one of {CONTENDERS}.")


def _measure(config, mode, x, y):
    """Times the contenders of one mode; returns their rows."""
    contenders, weights = [], None
    for name in CONTENDERS:
        made = _model(config, name)
        if made is None:
            logging.info(
                "%s skipped: Keras %s has no MultiOptimizer", name, keras.__version__
            )
            continue
        model, optimizer = made
        if weights is None:
            weights = model.get_weights()
        model.set_weights(weights)
        model.compile(
            optimizer=optimizer,
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            jit_compile=mode == "jit",
            steps_per_execution=config.steps_per_execution,
        )
        contenders.append(harness.Timed.of_config(name, model, x, y, config))
    times, _ = harness.round_robin(contenders, config.repeats)
    final = {c.key: c.model.get_weights() for c in contenders}
    trainable = [
        i for i, v in enumerate(contenders[0].model.weights) if v.trainable
    ]  # the same layout in every contender
    rows = []
    for contender in contenders:
        name = contender.key
        ratio, low, high = harness.paired_ratios(times, name, "keras")
        multi = "multi_optimizer" in times
        diff = distance = None
        if multi:
            ours, theirs = final[name], final["multi_optimizer"]
            diff = max(float(np.max(np.abs(ours[i] - theirs[i]))) for i in trainable)
            distance = max(
                float(np.linalg.norm(ours[i] - theirs[i]))
                / max(float(np.linalg.norm(theirs[i] - weights[i])), 1e-30)
                for i in trainable
            )
        rows.append(
            {
                "contender": name,
                "mode": mode,
                "step_ms": 1e3 * statistics.median(times[name]),
                "ratio_to_keras": ratio,
                "ratio_to_multi_optimizer": (
                    harness.paired_ratios(times, name, "multi_optimizer")[0]
                    if multi
                    else None
                ),
                "ratio_spread": [low, high],
                "max_abs_diff": diff,
                "distance": distance,
                "agrees": None if distance is None else distance <= config.tolerance,
            }
        )
    return rows


def format_table(rows):
    """Returns `rows` as a fixed-width text table."""

    def number(value, spec):
        return "-" if value is None else format(value, spec)

    lines = [
        f"{'contender':16} {'mode':5} {'ms/step':>8} {'/keras':>7} {'/multi':>7}"
        f" {'max |diff|':>10} {'distance':>9} {'agrees':>6}"
    ]
    for row in rows:
        lines.append(
            f"{row['contender']:16} {row['mode']:5} {row['step_ms']:8.2f}"
            f" {row['ratio_to_keras']:7.3f}"
            f" {number(row['ratio_to_multi_optimizer'], '7.3f')}"
            f" {number(row['max_abs_diff'], '10.2e')} {number(row['distance'], '9.2e')}"
            f" {str(row['agrees']):>6}"
        )
    return "\n".join(lines)


WHAT = (
    "Layer-wise learning-rate decay over {blocks} blocks (decay {decay}), AdamW with"
    " weight decay {weight_decay} and a cosine schedule. Ratios are medians of paired"
    " per-round step times. After the same steps, 'distance' is the largest"
    " |w - w_multi| / |w_multi - w_start| over the variables (how far a contender"
    " ended from MultiOptimizer's weights, relative to how far those moved);"
    " 'agrees': distance <= {tolerance}. maskfit = MaskedModel +"
    " layerwise_decay; rates_step = stock step, optimizer.apply under"
    " scaled_learning_rates (the mechanism MaskedModel's step uses)."
)


def run(config, workdir):
    """Measures every mode; writes `layerwise_rates.{json,csv}` and the config to `workdir`.

    Returns:
      The rows, as dicts with the keys in `COLUMNS`.
    """
    harness.write_config(workdir, config)
    rng = np.random.default_rng(config.seed)
    x = rng.standard_normal((config.batch, config.width)).astype(np.float32)
    y = rng.integers(0, config.classes, size=(config.batch,)).astype(np.int32)
    rows = []
    for mode in config.modes:
        rows.extend(_measure(config, mode, x, y))
    what = WHAT.format(**dataclasses.asdict(config))
    harness.write_json(
        workdir,
        "layerwise_rates.json",
        {"what": what, "machine": harness.machine(), "rows": rows},
    )
    harness.write_csv(workdir, "layerwise_rates.csv", rows, COLUMNS)
    return rows
