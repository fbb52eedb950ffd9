"""What a mask value of 0.1 does under each optimizer, with MaskedModel.

    python -m benchmarks.fractional_masks

A Dense(2) head with `OutputMask([1.0, 0.1])` (Input(4) -> Dense(16, tanh) ->
head, MSE on 64 random examples, one epoch of 8 steps). For each optimizer,
the mean |change| of the 0.1 unit's kernel over that of the same unit in a
stock `keras.Model` run from the same weights: 0.1 is what the value means.
Two columns: `scale="gradient"` (the value multiplies the gradient, maskfit's
meaning before issue 24) and `scale="step"` (the default: it multiplies the
learning rate). docs/learning_rates.md holds the table.
"""

from absl import app

from benchmarks.fractional_masks import lib
from experiments.common import cli


def main(argv):
    cli.check_argv(argv)
    print(lib.format_table(lib.measure()))


if __name__ == "__main__":
    app.run(main)
