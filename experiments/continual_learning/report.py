"""What a continual learning run reports: summary over seeds, tables, figure, scalars.

`summarize` turns the per-seed results of `lib.run` into
the mean and spread per method; `tables` writes them as Markdown (per
sequence: a line per method, then each method's accuracy matrix, then
PackNet's capacity); `figure` draws, per sequence and method, one accuracy
curve per task over the sequence (matplotlib, when installed);
`write_events` writes TensorBoard scalars.
"""

import os

import numpy as np
import tensorflow as tf

from experiments.common import report as common_report

__all__ = ["figure", "summarize", "tables", "write_events"]

_LABELS = {
    "packnet": "PackNet",
    "finetune": "fine-tuning",
    "separate": "separate networks",
    "ewc": "EWC",
    "packnet_gradmask": "PackNet, hand-written gradient masks",
}


def summarize(per_seed, methods):
    """Returns {method: summary over seeds} for one sequence.

    Args:
      per_seed: {seed: {method: result of `learn_sequence`}}.
      methods: the methods, in the order to report them.

    Returns:
      Per method: `accuracy` (the mean matrix, None above the diagonal),
      `average_accuracy` (a spread per task learned), `final_average_accuracy`
      and `backward_transfer` (spreads over seeds), `logits_identical` (how
      many earlier tasks kept their logits bit for bit, and out of how many,
      over all seeds), `max_logit_change`, `parameters` and, for PackNet,
      `capacity` (the same for every seed).

    Example:

    >>> result = {"accuracy": [[0.9, None], [0.8, 0.7]],
    ...           "average_accuracy": [0.9, 0.75], "backward_transfer": -0.1,
    ...           "logits_identical": [False], "max_logit_change": [2.0],
    ...           "parameters": 10, "seconds": [1, 1]}
    >>> summarize({"0": {"finetune": result}}, ["finetune"])["finetune"]["accuracy"]
    [[0.9, None], [0.8, 0.7]]
    """
    summary = {}
    for method in methods:
        results = [by_method[method] for by_method in per_seed.values()]
        matrices = np.array(
            [
                [[np.nan if a is None else a for a in row] for row in r["accuracy"]]
                for r in results
            ]
        )
        mean = matrices.mean(axis=0)
        steps = zip(*(r["average_accuracy"] for r in results))
        identical = [same for r in results for same in r["logits_identical"]]
        summary[method] = {
            "accuracy": [
                [None if np.isnan(a) else float(a) for a in row] for row in mean
            ],
            "average_accuracy": [common_report.spread(step) for step in steps],
            "final_average_accuracy": common_report.spread(
                [r["average_accuracy"][-1] for r in results]
            ),
            "backward_transfer": common_report.spread(
                [r["backward_transfer"] for r in results]
            ),
            "logits_identical": [int(sum(identical)), len(identical)],
            "max_logit_change": max(max(r["max_logit_change"]) for r in results),
            "parameters": results[0]["parameters"],
        }
        if "capacity" in results[0]:
            summary[method]["capacity"] = results[0]["capacity"]
    return summary


def _cell(spread, scale=100, digits=1, sign=""):
    return common_report.cell(spread, scale, digits, sign)


def _sequence_table(summary, tasks):
    lines = [
        "| method | parameters | average accuracy % after each task |"
        " final average accuracy % | BWT (pp) | earlier tasks' logits bit for bit |",
        "|" + " --- |" * 6,
    ]
    for method, row in summary.items():
        steps = " / ".join(f"{100 * s['mean']:.1f}" for s in row["average_accuracy"])
        same, out_of = row["logits_identical"]
        lines.append(
            f"| {_LABELS.get(method, method)} | {row['parameters']:,} | {steps} |"
            f" {_cell(row['final_average_accuracy'])} |"
            f" {_cell(row['backward_transfer'], sign='+')} |"
            f" {same} of {out_of} (max change {row['max_logit_change']:.3g}) |"
        )
    for method, row in summary.items():
        lines += [
            "",
            f"{_LABELS.get(method, method)}: accuracy % on each task (columns)"
            " after learning each task (rows), mean over seeds",
            "",
        ]
        lines.append("| after | " + " | ".join(t["name"] for t in tasks) + " |")
        lines.append("|" + " --- |" * (len(tasks) + 1))
        for i, accuracies in enumerate(row["accuracy"]):
            cells = ["" if a is None else f"{100 * a:.1f}" for a in accuracies]
            lines.append(f"| {i + 1}. {tasks[i]['name']} | " + " | ".join(cells) + " |")
    for method, row in summary.items():
        if "capacity" not in row:
            continue
        label = _LABELS.get(method, method)
        lines += [
            "",
            f"{label}: % of each layer's kernel owned by each task, and free",
            "",
            "| layer | " + " | ".join(t["name"] for t in tasks) + " | free |",
            "|" + " --- |" * (len(tasks) + 2),
        ]
        for layer, shares in row["capacity"].items():
            cells = [f"{100 * s:.1f}" for s in shares["per_task"]]
            cells.append(f"{100 * shares['free']:.1f}")
            lines.append(f"| {layer} | " + " | ".join(cells) + " |")
    return lines


def tables(summary, tasks):
    """Returns the summary of every sequence as Markdown.

    Args:
      summary: {sequence: `summarize`'s result}.
      tasks: {sequence: [{"name": ...}, ...]}, the tasks in order.
    """
    lines = []
    for sequence, by_method in summary.items():
        lines += [f"### {sequence}", "", "Mean [min, max] over seeds.", ""]
        lines += _sequence_table(by_method, tasks[sequence]) + [""]
    return "\n".join(lines)


def figure(summary, config, path):
    """Draws one panel per sequence and method into the PNG at `path`; returns it.

    Each panel has one curve per task: its test accuracy (mean over seeds)
    after each task of the sequence from its own on, and the average
    accuracy over the tasks seen so far, dashed. Without matplotlib it logs
    a warning, draws nothing and returns None.
    """
    rows, columns = len(summary), len(config.methods)
    fig = common_report.new_figure(figsize=(3.2 * columns, 2.8 * rows + 0.6))
    if fig is None:
        return None
    axes = np.array(fig.subplots(rows, columns, squeeze=False, sharey="row"))
    # In the run's order (metrics.json sorts the keys).
    ordered = [s for s in config.sequences if s in summary]
    for r, (sequence, by_method) in enumerate((s, summary[s]) for s in ordered):
        for c, method in enumerate(config.methods):
            row, ax = by_method[method], axes[r, c]
            count = len(row["accuracy"])
            for j in range(count):
                steps = range(j + 1, count + 1)
                values = [100 * row["accuracy"][i][j] for i in range(j, count)]
                ax.plot(steps, values, marker="o", markersize=3, label=f"task {j + 1}")
            average = [100 * s["mean"] for s in row["average_accuracy"]]
            ax.plot(range(1, count + 1), average, "k--", label="average")
            ax.set_title(
                f"{_LABELS.get(method, method)}\n{sequence}: BWT"
                f" {100 * row['backward_transfer']['mean']:+.1f} pp",
                fontsize=9,
            )
            ax.set_xticks(range(1, count + 1))
            ax.grid(alpha=0.3)
            if r == rows - 1:
                ax.set_xlabel("tasks learned")
            if c == 0:
                ax.set_ylabel("test accuracy %")
                ax.legend(fontsize=7, loc="lower left")
    packnet = ""
    if any(m.startswith("packnet") for m in config.methods):
        packnet = (
            f"\nPackNet frees {100 * config.prune_fraction:g}% of what a task"
            f" trained, retrains {config.retrain_epochs} epochs"
        )
    decay = (
        "" if config.weight_decay is None else f", weight decay {config.weight_decay:g}"
    )
    title = (
        f"MLP {'-'.join(map(str, config.hidden_units))}, {config.optimizer}"
        f" {config.learning_rate:g}{decay}, {config.epochs} epochs per task; mean"
        f" over {len(config.seeds)} seed(s){packnet}"
    )
    return common_report.save_figure(fig, path, title, dpi=80, fontsize=10)


def write_events(directory, results, summary):
    """Writes TensorBoard scalars under `directory/<sequence>/<method>`.

    The step is the number of tasks learned: per seed, the accuracy on each
    task seen and the average accuracy; over seeds, their means; at the last
    step, the backward transfer.
    """
    for sequence, by_method in summary.items():
        for method, row in by_method.items():
            path = os.path.join(directory, sequence, method)
            writer = tf.summary.create_file_writer(path)
            try:
                for i, accuracies in enumerate(row["accuracy"]):
                    scalars = {"average_accuracy": row["average_accuracy"][i]["mean"]}
                    for seed, by_seed in results[sequence].items():
                        result = by_seed[method]
                        for j in range(i + 1):
                            scalars[f"seed_{seed}/task_{j + 1}"] = result["accuracy"][
                                i
                            ][j]
                        scalars[f"seed_{seed}/average_accuracy"] = result[
                            "average_accuracy"
                        ][i]
                    for j in range(i + 1):
                        scalars[f"task_{j + 1}"] = accuracies[j]
                    if i == len(row["accuracy"]) - 1:
                        scalars["backward_transfer"] = row["backward_transfer"]["mean"]
                    common_report.write_scalars(writer, i + 1, scalars)
            finally:
                writer.close()
