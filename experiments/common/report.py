"""How experiments and benchmarks report: JSON, TensorBoard scalars, tables, figures.

A run writes its config and metrics with `write_json` and its curves with
`write_scalars` (`maskfit.scalars`'s, which the package's `PruningSummaries`
uses too); its summary over seeds holds one `spread` per metric, shown in
Markdown tables with `cell` and `markdown_table` and drawn into a figure
made by `new_figure` (None without matplotlib), `error_bars` and
`save_figure`.
"""

import json

import numpy as np
from absl import logging

from maskfit.scalars import SCALAR_METADATA, write_scalars

__all__ = [
    "SCALAR_METADATA",
    "cell",
    "error_bars",
    "markdown_table",
    "new_figure",
    "save_figure",
    "spread",
    "write_json",
    "write_scalars",
]


def write_json(path, value):
    """Writes `value` to `path` as indented JSON with sorted keys.

    Example:
      >>> write_json("/tmp/config.json", {"seed": 0})
    """
    with open(path, "w") as f:
        json.dump(value, f, indent=2, sort_keys=True)
        f.write("\n")


def spread(values):
    """Mean, standard deviation, min, max and the values of a metric over seeds.

    Example:
      >>> spread([0.5, 1.0])["mean"]
      0.75
    """
    values = np.asarray(values, np.float64)
    return {
        "mean": float(values.mean()),
        "std": float(values.std()),
        "min": float(values.min()),
        "max": float(values.max()),
        "values": values.tolist(),
    }


def cell(spread_, scale=1.0, digits=0, sign=""):
    """A table cell `mean [min, max]` of a `spread`, times `scale`.

    Example:
      >>> cell(spread([0.5, 1.0]), scale=100, digits=1)
      '75.0 [50.0, 100.0]'
    """
    values = [spread_[k] * scale for k in ("mean", "min", "max")]
    return "{:{s}.{d}f} [{:{s}.{d}f}, {:{s}.{d}f}]".format(*values, d=digits, s=sign)


def markdown_table(header, rows):
    """The lines of a Markdown table: the header, its rule, one line per row.

    Example:
      >>> markdown_table(["a", "b"], [[1, 2]])
      ['| a | b |', '| --- | --- |', '| 1 | 2 |']
    """
    lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return lines


def new_figure(figsize):
    """A matplotlib `Figure` (constrained layout), or None without matplotlib.

    Without matplotlib it logs a warning naming the extra that installs it.

    Example:
      >>> fig = new_figure((6, 4))
    """
    try:
        from matplotlib.figure import Figure
    except ImportError:
        logging.warning(
            "matplotlib is not installed, so the run draws no figure; install it"
            ' with `pip install ".[experiments]"` (or matplotlib).'
        )
        return None
    return Figure(figsize=figsize, layout="constrained")


def error_bars(axes, x, spreads, scale=1.0, **style):
    """Draws the means of `spreads` against `x` with min-max error bars.

    Example:
      >>> error_bars(axes, [1, 2], [spread([1, 2]), spread([3])], label="a")
    """
    mean, low, high = (
        np.array([s[k] for s in spreads]) * scale for k in ("mean", "min", "max")
    )
    style = dict(dict(marker="o", markersize=4, capsize=3), **style)
    return axes.errorbar(x, mean, yerr=[mean - low, high - mean], **style)


def save_figure(fig, path, title, dpi=90, fontsize=None):
    """Titles `fig`, saves it as the PNG `path`, logs it and returns `path`.

    Example:
      >>> save_figure(fig, "/tmp/run/figure.png", "Accuracy against sparsity")
      '/tmp/run/figure.png'
    """
    fig.suptitle(title, fontsize=fontsize)
    fig.savefig(path, dpi=dpi)
    logging.info("Wrote %s", path)
    return path
