r"""Trains the seed's two-output model with some outputs frozen by an OutputMask.

Examples:

  python -m experiments.masked_outputs --mode=manual --workdir=/tmp/manual
  python -m experiments.masked_outputs --mode=fit --backprop --workdir=/tmp/fit
  python -m experiments.masked_outputs --strategy=mirrored \
      --precision=mixed_float16 --workdir=/tmp/mirrored
"""

from absl import app, flags, logging

from experiments import common
from experiments.masked_outputs_lib import Config, run

_MODE = flags.DEFINE_enum(
    "mode",
    "manual",
    ["manual", "fit"],
    "manual: constant gradient via"
    " apply_gradients; fit: MaskedModel.fit towards --targets.",
)
_STEPS = flags.DEFINE_integer("steps", 100, "Training steps.")
_OPTIMIZER = flags.DEFINE_string("optimizer", "nadam", "A keras.optimizers name.")
_LEARNING_RATE = flags.DEFINE_float("learning_rate", 0.005, "Learning rate.")
_GRADIENT = flags.DEFINE_float(
    "constant_gradient", -0.3, "manual: the gradient of every learning entry."
)
_TARGETS = flags.DEFINE_list("targets", ["4", "6"], "fit: one target per output.")
_MASKED = flags.DEFINE_list("masked_outputs", ["1"], "Indices of frozen outputs.")
_BACKPROP = flags.DEFINE_bool(
    "backprop", False, "Also block the frozen outputs' gradient upstream."
)
_SEED = flags.DEFINE_integer("seed", 0, "Random seed of the initial weights.")
_JIT = flags.DEFINE_bool(
    "jit_compile",
    False,
    "Also compile with XLA (recompiles per loop length; slower on CPU).",
)
_STEPS_PER_EXECUTION = flags.DEFINE_integer(
    "steps_per_execution",
    None,
    "fit: steps per compiled call (default: all); must be 1 under a strategy.",
)
# Any strategy but 'default' needs --nojit_compile, and in fit mode
# --steps_per_execution=1.
_STRATEGY, _PRECISION = common.define_scale_flags()
_WORKDIR = flags.DEFINE_string("workdir", None, "Where to write the results.")
flags.mark_flag_as_required("workdir")


def _config_from_flags():
    try:
        targets = tuple(float(t) for t in _TARGETS.value)
        masked = tuple(int(k) for k in _MASKED.value)
    except ValueError as e:
        raise app.UsageError(
            f"--targets and --masked_outputs must be numbers: {e}"
        ) from None
    config = Config(
        mode=_MODE.value,
        steps=_STEPS.value,
        optimizer=_OPTIMIZER.value,
        learning_rate=_LEARNING_RATE.value,
        constant_gradient=_GRADIENT.value,
        targets=targets,
        masked_outputs=masked,
        backprop=_BACKPROP.value,
        seed=_SEED.value,
        jit_compile=_JIT.value,
        steps_per_execution=_STEPS_PER_EXECUTION.value,
        strategy=_STRATEGY.value,
        precision=_PRECISION.value,
    )
    try:
        config.validate()
    except ValueError as e:
        raise app.UsageError(str(e)) from None
    return config


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
    config = _config_from_flags()
    metrics = run(config, _WORKDIR.value)
    logging.info(
        "%s: %d steps in %.3f s; prediction for input 1 %s -> %s;"
        " largest change of a masked entry %g",
        config.mode,
        config.steps,
        metrics["train_seconds"],
        [round(p, 4) for p in metrics["initial_prediction"]],
        [round(p, 4) for p in metrics["final_prediction"]],
        metrics["masked_max_abs_change"],
    )


if __name__ == "__main__":
    app.run(main)
