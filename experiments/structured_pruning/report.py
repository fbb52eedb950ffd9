"""The structured-pruning experiment's summary, table and figure.

`summarize` turns `structured_maskfit.run_arm`'s records into one row per
(data set, network, fraction), the dense network (fraction 0, as trained
before pruning) first; `format_table` writes them as Markdown; `plot` draws
test accuracy against batch-64 and batch-1 latency with each panel's Pareto
front; `pareto` is the front itself.
"""

from experiments.common import report as common_report

__all__ = ["format_table", "pareto", "plot", "summarize"]


def _latency(latency_rows, dataset, kind, contender):
    """`{batch: {"ms", "dense_ms", "ratio", "ratio_p10_p90"}}` of one model."""
    found = {}
    for row in latency_rows:
        if (row["dataset"], row["architecture"]) != (dataset, kind):
            continue
        wall = row["wall"][contender]
        found[str(row["batch"])] = {
            "ms": wall["ms"]["median"],
            "dense_ms": row["wall"]["dense"]["ms"]["median"],
            "ratio": wall["ratio"]["median"],
            "ratio_p10_p90": [wall["ratio"]["p10"], wall["ratio"]["p90"]],
            "cpu_ratio": row["cpu"][contender]["ratio"]["median"],
        }
    return found


def summarize(runs, latency_rows):
    """One row per (dataset, architecture, fraction), over seeds.

    Fraction 0 is the dense network as trained before pruning (its
    accuracy is each seed's `dense_accuracy`, after the dense epochs only).

    Example:

    >>> runs = [dict(dataset="d", architecture="mlp", fraction=0.5, seed=0,
    ...              params=5, macs=6, dense_params=20, dense_macs=24,
    ...              test_accuracy=0.9, dense_accuracy=0.8)]
    >>> [row["fraction"] for row in summarize(runs, [])]
    [0.0, 0.5]
    """
    rows = []
    for dataset, kind in sorted({(r["dataset"], r["architecture"]) for r in runs}):
        group = [
            r for r in runs if (r["dataset"], r["architecture"]) == (dataset, kind)
        ]
        first = group[0]
        rows.append(
            {
                "dataset": dataset,
                "architecture": kind,
                "fraction": 0.0,
                "seeds": len({r["seed"] for r in group}),
                "params": first["dense_params"],
                "macs": first["dense_macs"],
                "params_removed": 0.0,
                "macs_removed": 0.0,
                "accuracy": common_report.spread(
                    [
                        r["dense_accuracy"]
                        for r in group
                        if r["fraction"] == first["fraction"]
                    ]
                ),
                "latency": _latency(latency_rows, dataset, kind, "dense"),
            }
        )
        for fraction in sorted({r["fraction"] for r in group}):
            same = [r for r in group if r["fraction"] == fraction]
            rows.append(
                {
                    "dataset": dataset,
                    "architecture": kind,
                    "fraction": fraction,
                    "seeds": len(same),
                    "params": same[0]["params"],
                    "macs": same[0]["macs"],
                    "params_removed": 1 - same[0]["params"] / same[0]["dense_params"],
                    "macs_removed": 1 - same[0]["macs"] / same[0]["dense_macs"],
                    "accuracy": common_report.spread(
                        [r["test_accuracy"] for r in same]
                    ),
                    "follows_width_rule": all(
                        r.get("follows_width_rule") for r in same
                    ),
                    "latency": _latency(latency_rows, dataset, kind, str(fraction)),
                }
            )
    return rows


def _percent(value):
    return f"{100 * value:.1f}%"


def format_table(metrics):
    """The summary as a Markdown table, with the machine and the run's time."""
    batches = sorted({b for row in metrics["summary"] for b in row["latency"]}, key=int)
    header = (
        "| data | network | fraction | seeds | params (removed) | MACs (removed) |"
        " accuracy mean ± std [min, max] |"
    )
    rule = "|---|---|---:|---:|---:|---:|---|"
    for batch in batches:
        header += f" b{batch} ms | b{batch} shrunk/dense [p10, p90] |"
        rule += "---:|---|"
    lines = [header, rule]
    for row in metrics["summary"]:
        acc = row["accuracy"]
        line = (
            f"| {row['dataset']} | {row['architecture']} | {row['fraction']:.2f} |"
            f" {row['seeds']} | {row['params']} ({_percent(row['params_removed'])}) |"
            f" {row['macs']} ({_percent(row['macs_removed'])}) |"
            f" {_percent(acc['mean'])} ± {_percent(acc['std'])}"
            f" [{_percent(acc['min'])}, {_percent(acc['max'])}] |"
        )
        for batch in batches:
            timed = row["latency"].get(batch)
            if timed is None:
                line += " - | - |"
                continue
            low, high = timed["ratio_p10_p90"]
            line += (
                f" {timed['ms']:.3f} | {timed['ratio']:.3f} [{low:.3f}, {high:.3f}] |"
            )
        lines.append(line)
    machine = metrics["machine"]
    lines += [
        "",
        f"Fraction 0.00: the dense network before pruning. {machine['cpu']},"
        f" {machine['cores']} cores, load average {machine['load_average_before'][0]:.1f}"
        f" before and {machine['load_average'][0]:.1f} after; TensorFlow"
        f" {machine['tensorflow']}, Keras {machine['keras']}; {metrics['seconds']:.0f} s.",
    ]
    return "\n".join(lines) + "\n"


def pareto(points):
    """Indices of the points `(latency, accuracy)` that no other point beats.

    A point is beaten by one at most as slow and at least as accurate, and
    better in one of the two. Returned in order of latency.

    Example:

    >>> pareto([(1.0, 0.9), (2.0, 0.95), (3.0, 0.93), (0.5, 0.8)])
    [3, 0, 1]
    """
    front = []
    for i, (t, a) in enumerate(points):
        beaten = any(
            u <= t and b >= a and (u < t or b > a)
            for j, (u, b) in enumerate(points)
            if j != i
        )
        if not beaten:
            front.append(i)
    return sorted(front, key=lambda i: points[i][0])


# How the x axis names each inference path of `experiments.common.latency`.
_RUNTIMES = {"tflite": "LiteRT", "function": "tf.function", "xla": "tf.function XLA"}


def plot(summary, path, keras_path="tflite"):
    """Accuracy against latency per (data set, network), with the Pareto front.

    `keras_path` (`experiments.common.latency.KERAS_PATHS`) names the runtime timed.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = sorted({(r["dataset"], r["architecture"]) for r in summary})
    batches = sorted({b for r in summary for b in r["latency"]}, key=int)
    from matplotlib import ticker

    columns = min(2, len(panels))
    rows_of_panels = -(-len(panels) // columns)
    fig, axes = plt.subplots(
        rows_of_panels,
        columns,
        figsize=(5.2 * columns, 3.6 * rows_of_panels),
        squeeze=False,
    )
    for ax in axes.flat[len(panels) :]:
        ax.set_visible(False)
    for ax, (dataset, kind) in zip(axes.flat, panels):
        rows = [
            r for r in summary if (r["dataset"], r["architecture"]) == (dataset, kind)
        ]
        for batch, marker in zip(batches, "os^D"):
            points = [(r["latency"][batch]["ms"], r["accuracy"]["mean"]) for r in rows]
            ms = [p[0] for p in points]
            acc = [100 * p[1] for p in points]
            err = [100 * r["accuracy"]["std"] for r in rows]
            ax.errorbar(
                ms, acc, yerr=err, fmt=marker, label=f"batch {batch}", capsize=2
            )
            for r, x, y in zip(rows, ms, acc):
                ax.annotate(
                    f"{r['fraction']:.2f}",
                    (x, y),
                    fontsize=7,
                    xytext=(3, 3),
                    textcoords="offset points",
                )
            front = pareto(points)
            ax.plot(
                [ms[i] for i in front],
                [acc[i] for i in front],
                "--",
                lw=1,
                color=ax.lines[-1].get_color() if ax.lines else None,
            )
        ax.set_xscale("log")
        ax.xaxis.set_major_formatter(ticker.FormatStrFormatter("%g"))
        ax.xaxis.set_minor_formatter(ticker.NullFormatter())
        ax.set_xlabel(
            f"median latency per call, {_RUNTIMES.get(keras_path, keras_path)} (ms, log)"
        )
        ax.set_ylabel("test accuracy (%)")
        ax.set_title(f"{kind} on {dataset}", fontsize=10)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(
        "Fraction of units removed (labels): accuracy vs CPU latency", fontsize=10
    )
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
