"""What a lottery ticket run reports: the summary over seeds, a table, a figure, scalars.

`summarize` turns the per-seed results of `lib.run` into the
mean and spread per arm and round; `table` writes them as Markdown; `figure`
draws the paper's two panels (early-stopping iteration and test accuracy
against the percentage of weights remaining) with matplotlib, when it is
installed; `write_curve` and `write_summary` write TensorBoard scalars.
"""

from experiments.common import report as common_report

__all__ = ["figure", "summarize", "table", "write_curve", "write_summary"]

_METRICS = ("early_stop_iteration", "test_accuracy")
# The arms in the order (and so the colours) of the tables and figures.
_LABELS = {
    "ticket": "winning ticket",
    "reinit": "random reinit (same masks)",
    "random": "random pruning (same sparsity)",
}


def _arms(summary):
    """The arms of `summary` in `_LABELS`' order (JSON sorts keys), others after."""
    return sorted(
        summary,
        key=lambda arm: list(_LABELS).index(arm) if arm in _LABELS else len(_LABELS),
    )


def summarize(per_seed, arms):
    """Returns {arm: [one row per round]}: the metrics' spread over seeds.

    Args:
      per_seed: {seed: {arm: [result per round]}}, as `run` builds it.
      arms: the arms to summarize.

    Returns:
      Per arm, one dict per round with `round`, `remaining` (fraction of
      kernel weights per layer and "all", the same for every seed),
      `stopped_at_end` (how many seeds had their least validation loss at the
      last evaluation) and, for each of the paper's metrics, its mean, std,
      min, max and per-seed values.

    Example:

    >>> result = {"early_stop_iteration": 40, "test_accuracy": 0.9,
    ...           "remaining": {"all": 1.0}, "stopped_at_end": False}
    >>> summarize({"0": {"ticket": [result]}}, ["ticket"])["ticket"][0]["round"]
    0
    """
    summary = {}
    for arm in arms:
        rounds = zip(*(results[arm] for results in per_seed.values()))
        summary[arm] = [
            {
                "round": round_,
                "remaining": results[0]["remaining"],
                "stopped_at_end": sum(r["stopped_at_end"] for r in results),
                **{m: common_report.spread([r[m] for r in results]) for m in _METRICS},
            }
            for round_, results in enumerate(rounds)
        ]
    return summary


def table(summary, layer_names):
    """Returns the summary as a Markdown table: mean [min, max] over seeds.

    One row per round; the columns are the weights remaining (all kernel
    weights, then per layer), then each metric for each arm. An early-stop
    iteration is marked * where some seed's validation loss was least at the
    last evaluation: it may still have been falling, so the true early-stop
    iteration may be later.
    """
    arms = _arms(summary)
    header = ["round", "weights remaining % (" + " / ".join(layer_names) + ")"]
    header += [f"early-stop iteration: {arm}" for arm in arms]
    header += [f"test accuracy %: {arm}" for arm in arms]
    lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    for index, row in enumerate(summary[arms[0]]):
        remaining = row["remaining"]
        layers = " / ".join(f"{100 * remaining[n]:.1f}" for n in layer_names)
        cells = [str(row["round"]), f"{100 * remaining['all']:.1f} ({layers})"]
        for arm in arms:
            stats = summary[arm][index]
            at_end = "*" if stats["stopped_at_end"] else ""
            cells.append(common_report.cell(stats["early_stop_iteration"]) + at_end)
        cells += [
            common_report.cell(summary[a][index]["test_accuracy"], 100, 1) for a in arms
        ]
        lines.append("| " + " | ".join(cells) + " |")
    if any(row["stopped_at_end"] for rows in summary.values() for row in rows):
        lines.append(
            "\n\\* the least validation loss of some seed was at the last"
            " evaluation: that training may not have reached its early-stop point."
        )
    return "\n".join(lines) + "\n"


def figure(summary, config, path):
    """Draws the paper's two panels into the PNG at `path`; returns `path`.

    Early-stopping iteration and test accuracy at that iteration against the
    percentage of weights remaining (log scale, falling to the right), mean
    over seeds with min-max error bars, one line per arm. Without matplotlib
    it logs a warning, draws nothing and returns None.
    """
    fig = common_report.new_figure((11, 4.2))
    if fig is None:
        return None
    panels = zip(
        fig.subplots(1, 2),
        _METRICS,
        (1, 100),
        ("Early-stop iteration (validation)", "Accuracy at early stop (test, %)"),
    )
    for axes, metric, scale, ylabel in panels:
        for arm in _arms(summary):
            rows = summary[arm]
            x = [100 * row["remaining"]["all"] for row in rows]
            spreads = [row[metric] for row in rows]
            common_report.error_bars(
                axes, x, spreads, scale, label=_LABELS.get(arm, arm)
            )
        axes.set_xscale("log")
        axes.invert_xaxis()
        axes.minorticks_off()
        every = -(-len(x) // 10)  # At most 10 labels, so that they do not overlap.
        axes.set_xticks(
            x, [f"{v:.3g}" if i % every == 0 else "" for i, v in enumerate(x)]
        )
        axes.set_xlabel("Percent of weights remaining")
        axes.set_ylabel(ylabel)
        axes.grid(alpha=0.3)
    axes.legend(loc="lower left")
    seeds = len(config.seeds)
    title = (
        f"LeNet-{'-'.join(map(str, config.hidden_units))} on digits,"
        f" {config.optimizer} {config.learning_rate:g}, rewind to step"
        f" {config.rewind_step}; mean and min-max over {seeds} seeds"
    )
    return common_report.save_figure(fig, path, title)


def write_curve(writer, seed, round_, curve):
    """Writes one training's validation loss and test accuracy against its step."""
    prefix = f"round_{round_:02d}/seed_{seed}"
    for step, loss, accuracy in curve:
        common_report.write_scalars(
            writer,
            step,
            {f"{prefix}/validation_loss": loss, f"{prefix}/test_accuracy": accuracy},
        )


def write_summary(writer, rows):
    """Writes, per round (the step), the weights remaining and the metrics' means."""
    for row in rows:
        scalars = {"remaining_percent": 100 * row["remaining"]["all"]}
        scalars.update({m: row[m]["mean"] for m in _METRICS})
        common_report.write_scalars(writer, row["round"], scalars)
