"""What a sparse training run reports: summary over seeds, table, figure, scalars.

`summarize` turns the results of `lib.run` into the mean and
spread of the test accuracy per task, method and sparsity; `table` writes
them as Markdown; `figure` draws test accuracy against sparsity, one panel
per task and one line per method (dense as a horizontal band), with
matplotlib when it is installed; `write_curve` and `write_summary` write
TensorBoard scalars.
"""

import numpy as np

from experiments.common import report as common_report
from experiments.sparse_training import train

__all__ = ["figure", "summarize", "table", "write_curve", "write_summary"]

# A colour per method, so that a figure keeps its colours when methods join.
_COLORS = {"static": "C0", "set": "C1", "rigl": "C2", "pruning": "C3"}
_LABELS = {
    "dense": "dense",
    "static": "static random sparse",
    "set": "SET",
    "rigl": "RigL",
    "pruning": "gradual magnitude pruning",
}


def summarize(results):
    """Returns `{task: {method: [row per sparsity]}}` over the seeds.

    Each row has `sparsity`, `seeds`, `test_accuracy` (mean, std, min, max
    and the values, in seed order) and `kernel_density` (the mean fraction
    of non-zero kernel weights at the end).

    Example:

    >>> r = {"task": "t", "method": "static", "sparsity": 0.9, "seed": 0,
    ...      "test_accuracy": 0.5, "kernel_density": {"all": 0.1}}
    >>> summarize([r])["t"]["static"][0]["test_accuracy"]["mean"]
    0.5
    """
    grouped = {}
    for r in sorted(results, key=lambda r: r["seed"]):
        key = (r["task"], r["method"], r["sparsity"])
        grouped.setdefault(key, []).append(r)
    summary = {}
    for (task, method, sparsity), runs in grouped.items():
        summary.setdefault(task, {}).setdefault(method, []).append(
            {
                "sparsity": sparsity,
                "seeds": [r["seed"] for r in runs],
                "test_accuracy": common_report.spread(
                    [r["test_accuracy"] for r in runs]
                ),
                "kernel_density": float(
                    np.mean([r["kernel_density"]["all"] for r in runs])
                ),
            }
        )
    for methods in summary.values():
        for rows in methods.values():
            rows.sort(key=lambda row: row["sparsity"])
    return summary


def _methods(summary_of_task):
    return [m for m in train.METHODS if m in summary_of_task]


def _cell(spread):
    return "{:.1f} ± {:.1f}".format(100 * spread["mean"], 100 * spread["std"])


def table(summary, config):
    """Returns the summary as Markdown: per task a row per sparsity, a column per method.

    Cells are the test accuracy in percent, mean ± std over the seeds; the
    dense column repeats the one dense result; the last column is the
    fraction of kernel weights that were non-zero at the end (the sparse
    methods', which match up to rounding).
    """
    lines = []
    for task, methods in summary.items():
        names = _methods(methods)
        sparse_names = [m for m in names if m != "dense"]
        header = ["sparsity %"] + [_LABELS[m] for m in names] + ["non-zero kernel %"]
        lines += [f"**{task}**", "", "| " + " | ".join(header) + " |"]
        lines.append("|" + " --- |" * len(header))
        for index, sparsity in enumerate(config.sparsities):
            cells = [f"{100 * sparsity:g}"]
            for method in names:
                rows = methods[method]
                row = rows[0] if method == "dense" else rows[index]
                cells.append(_cell(row["test_accuracy"]))
            density = [methods[m][index]["kernel_density"] for m in sparse_names]
            cells.append(
                " / ".join(f"{100 * d:.2f}" for d in density) if density else "-"
            )
            lines.append("| " + " | ".join(cells) + " |")
        lines.append("")
    seeds = len(config.seeds)
    lines.append(
        f"Test accuracy %, mean ± std over {seeds} seed{'s' * (seeds > 1)},"
        f" {config.train_steps} steps of {config.batch_size} examples for every"
        f" method; {config.sparsity_distribution} layer sparsities."
    )
    return "\n".join(lines) + "\n"


def figure(summary, config, path):
    """Draws test accuracy against sparsity, a panel per task, into the PNG at `path`.

    Mean over seeds with min-max error bars, one line per method; dense is a
    horizontal line with its min-max band. Without matplotlib it logs a
    warning, draws nothing and returns None.
    """
    tasks = list(summary)
    fig = common_report.new_figure(figsize=(4.2 * len(tasks) + 1, 4))
    if fig is None:
        return None
    panels = np.atleast_1d(fig.subplots(1, len(tasks)))
    x = [100 * s for s in config.sparsities]
    for axes, task in zip(panels, tasks):
        for method in _methods(summary[task]):
            rows = summary[task][method]
            spreads = [row["test_accuracy"] for row in rows]
            if method == "dense":
                dense = spreads[0]
                line = axes.axhline(
                    100 * dense["mean"], color="black", linestyle="--", label="dense"
                )
                axes.axhspan(
                    100 * dense["min"],
                    100 * dense["max"],
                    color=line.get_color(),
                    alpha=0.1,
                )
                continue
            common_report.error_bars(
                axes,
                x,
                spreads,
                100,
                label=_LABELS[method],
                color=_COLORS[method],
            )
        axes.set_xticks(x, [f"{v:g}" for v in x])
        axes.set_xlabel("Sparsity (%)")
        axes.set_ylabel("Test accuracy (%)")
        axes.set_title(task)
        axes.grid(alpha=0.3)
    panels[-1].legend(loc="lower left", fontsize="small")
    seeds = len(config.seeds)
    title = (
        f"{config.train_steps} steps for every method, {config.optimizer}"
        f" {config.learning_rate:g}, {config.sparsity_distribution}; mean and"
        f" min-max over {seeds} seed{'s' * (seeds > 1)}"
    )
    return common_report.save_figure(fig, path, title)


def write_curve(writer, result):
    """Writes one training's test accuracy against its step."""
    tag = f"sparsity_{100 * result['sparsity']:g}/seed_{result['seed']}/test_accuracy"
    for step, accuracy in result["curve"]:
        common_report.write_scalars(writer, step, {tag: accuracy})


def write_summary(writer, rows):
    """Writes, per sparsity (in percent, as the step), the mean test accuracy."""
    for row in rows:
        common_report.write_scalars(
            writer,
            int(round(100 * row["sparsity"])),
            {
                "test_accuracy": row["test_accuracy"]["mean"],
                "kernel_density": row["kernel_density"],
            },
        )
