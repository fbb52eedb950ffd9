r"""Times the seeds' own code against the experiments that reproduce them, in one process.

- learnable_scale (seeds/000): the seed's layer and custom gradient (made to run on
  Keras 3) trained with stock `fit` defaults, against `experiments.learnable_scale`
  with its defaults: the same 31250 SGD steps on the same batches.
- masked_outputs (seeds/002): the seed applies a hand-made gradient eagerly and calls
  `model.predict` after every step (manual part), and trains with an eager
  `GradientTape` loop (fit part). Our runs do the same steps compiled, and are
  reported twice: end to end (tracing included) and per step once compiled (the
  steps after the first call). Each of ours runs `--repeats` times and the best is
  kept (the first run of a process also pays TF's start-up).

  python -m benchmarks.seed_scenarios [--scenarios=learnable_scale,masked_outputs]
"""

from absl import app, flags

from benchmarks.seed_scenarios.runs import (
    ours,
    ours_learnable_scale,
    seed_learnable_scale,
    seed_manual,
    seed_tape,
)

_SCENARIOS = flags.DEFINE_list(
    "scenarios", ["learnable_scale", "masked_outputs"], "Which seeds to time."
)
_SAMPLES = flags.DEFINE_integer(
    "samples", 100_000, "learnable_scale: samples per epoch (the seed's 100000)."
)
_STEPS = flags.DEFINE_integer("steps", 100, "masked_outputs: steps of each loop.")
_REPEATS = flags.DEFINE_integer("repeats", 2, "Runs of each of ours; best kept.")


def main(argv):
    del argv
    scenarios = set(_SCENARIOS.value)
    unknown = scenarios - {"learnable_scale", "masked_outputs"}
    if unknown:
        raise app.UsageError(
            f"Unknown --scenarios {sorted(unknown)}; known: learnable_scale,"
            " masked_outputs."
        )
    steps, repeats = _STEPS.value, _REPEATS.value
    if "learnable_scale" in scenarios:
        mine, mine_scale = ours_learnable_scale(repeats, _SAMPLES.value)
        seed, seed_scale = seed_learnable_scale(_SAMPLES.value)
        print(
            f"learnable_scale  seed (stock fit defaults) {seed:6.2f}s scale"
            f" {seed_scale:.6f}  ours (defaults) {mine:6.2f}s scale"
            f" {mine_scale:.6f}  ({seed / mine:4.1f}x)"
        )
    if "masked_outputs" in scenarios:
        seed_manual(2), seed_tape(2)  # Warm up eager kernels for a fair baseline.
        rows = [
            ("manual", seed_manual(steps), *ours("manual", steps, repeats)),
            ("fit", seed_tape(steps), *ours("fit", steps, repeats)),
        ]
        print(
            f"masked_outputs, {steps} steps. 'ours' includes tracing; 'compiled'"
            " is per step after the first call (steady state)."
        )
        for mode, seed, mine, per_step in rows:
            print(
                f"{mode:7s} seed {seed:6.3f}s  ours {mine:6.3f}s"
                f" ({seed / mine:5.1f}x)  per step: seed"
                f" {seed / steps * 1e3:7.3f}ms compiled {per_step * 1e3:7.3f}ms"
                f" ({seed / steps / per_step:6.1f}x)"
            )


if __name__ == "__main__":
    app.run(main)
