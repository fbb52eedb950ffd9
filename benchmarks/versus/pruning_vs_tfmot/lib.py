"""Magnitude pruning side by side: TF-MOT on tf_keras, maskfit.pruning on Keras 3.

Every contender (`pruning_contenders`) trains the same MLP on the same task
(`pruning_task`): scikit-learn's bundled digits, the same initial weights,
the same batches in the same order, the same schedule and Adam. Each reports,
per seed, the zeros of each kernel at every pruning step, the final test
accuracy and the step time. For each seed and scenario the contenders train
side by side, an epoch each in turn (who goes first alternates), so that
their epochs are timed under the same machine load; the report gives each
one's median step time and the paired ratio of their epoch times.
"""

import dataclasses
import os
import platform
import statistics

import numpy as np

from benchmarks import harness
from benchmarks.pruning_vs_tfmot import task
from benchmarks.pruning_vs_tfmot.contenders import CONTENDERS

SCENARIOS = task.SCENARIOS


@dataclasses.dataclass(frozen=True)
class Config:
    """What to run; the defaults are those of issue 14.

    Attributes:
      scenarios: polynomial, constant, 2:4.
      contenders: Contenders to run.
      seeds: Seeds (integers).
      hidden: Units of each hidden layer.
      epochs: Epochs per run.
      batch_size: Batch size.
      learning_rate: Adam's learning rate.
      jit_compile: Compile both contenders' training steps with XLA.
      test_fraction: Fraction of the data held out to test.
      split_seed: Seed of the train/test split.
      max_train_examples: Keep this many training examples (0: all).
    """

    scenarios: tuple = ("polynomial", "constant", "2:4")
    # "keras" and "tf_keras" are references (the same model, not pruned, on
    # each Keras), not contenders.
    contenders: tuple = ("tfmot", "maskfit", "keras", "tf_keras")
    seeds: tuple = (0, 1, 2, 3, 4)
    hidden: tuple = (300, 100)
    epochs: int = 15
    batch_size: int = 32
    learning_rate: float = 1e-3
    # Both contenders compile their step with XLA (each Keras's own option).
    jit_compile: bool = False
    test_fraction: float = 0.2
    split_seed: int = 0
    max_train_examples: int = 0  # 0: all; a small number for smoke tests.

    def __post_init__(self):
        unknown = [s for s in self.scenarios if s not in SCENARIOS]
        if unknown:
            raise ValueError(
                f"Unknown scenarios {unknown}; expected some of {sorted(SCENARIOS)}."
            )
        unknown = [c for c in self.contenders if c not in CONTENDERS]
        if unknown:
            raise ValueError(
                f"Unknown contenders {unknown}; available: {sorted(CONTENDERS)}."
            )
        if not self.seeds or self.epochs < 1 or self.batch_size < 1:
            raise ValueError(
                "Need at least one seed, one epoch and a positive batch size."
                f" Received: seeds={self.seeds}, epochs={self.epochs},"
                f" batch_size={self.batch_size}"
            )


def run(config, workdir):
    """Trains every contender on every scenario and seed; writes JSON and markdown.

    Returns the results dict that `pruning_vs_tfmot.json` holds.
    """
    harness.write_config(workdir, config)
    data = task.load_data(config)
    load_before = os.getloadavg()
    runs = []
    for i, seed in enumerate(config.seeds):
        for scenario_name in config.scenarios:
            scenario = SCENARIOS[scenario_name]
            started = {
                c: CONTENDERS[c](config, scenario, seed, data)
                for c in config.contenders
            }
            for epoch, batches in enumerate(task.epoch_batches(config, data, seed)):
                # Alternate who goes first, so that neither always follows the other.
                shift = (i + epoch) % len(config.contenders)
                order = config.contenders[shift:] + config.contenders[:shift]
                for contender in order:
                    started[contender].epoch(epoch, batches)
            for contender, each in started.items():
                record = each.finish()
                record.update(contender=contender, scenario=scenario_name, seed=seed)
                runs.append(record)
    machine = _machine()
    machine["load_average_before"] = list(load_before)
    machine["load_average_after"] = list(os.getloadavg())
    results = {
        "machine": machine,
        "config": dataclasses.asdict(config),
        "steps_per_epoch": task.steps_per_epoch(config, data),
        "runs": runs,
        "summary": summarize(runs),
        "paired_step_time": {
            c: paired_step_time(runs, c) for c in config.contenders if c != "tfmot"
        },
        "own_cost": own_cost(runs),
    }
    harness.write_json(workdir, "pruning_vs_tfmot.json", results)
    harness.write_text(workdir, "pruning_vs_tfmot.md", format_markdown(results))
    return results


def summarize(runs):
    """One row per (scenario, contender): accuracy mean and spread, step time."""
    rows = []
    keys = sorted({(r["scenario"], r["contender"]) for r in runs})
    for scenario, contender in keys:
        group = [
            r for r in runs if (r["scenario"], r["contender"]) == (scenario, contender)
        ]
        accuracies = [r["test_accuracy"] for r in group]
        final = group[0]["final_zeros"]
        sizes = group[0]["kernel_sizes"]
        rows.append(
            {
                "scenario": scenario,
                "contender": contender,
                "seeds": len(group),
                "accuracy_mean": statistics.mean(accuracies),
                "accuracy_std": statistics.pstdev(accuracies),
                "step_ms_median": statistics.median(r["step_ms"] for r in group),
                "follows_schedule": all(r["follows_schedule"] for r in group),
                "revived_mean": statistics.mean(r["revived_total"] for r in group),
                "pruned_are_zero": all(r["pruned_are_zero"] for r in group),
                "pruning": group[0].get("pruning", True),
                "final_sparsity": {n: final[n] / sizes[n] for n in final},
            }
        )
    return rows


def paired_step_time(runs, contender="maskfit", baseline="tfmot"):
    """Per scenario: `contender`'s epoch time over `baseline`'s, epoch by epoch.

    The two trained the same epoch of the same seed one right after the
    other, so each ratio compares them under about the same machine load;
    the ratio of process CPU times is a second view, less swayed by other
    processes. First epochs (tracing) are left out. `total` (and `cpu_total`)
    is the ratio of the sums of those epochs over every seed: it counts what
    a median of ratios can leave out, such as a retrace in a later epoch.
    Returns `{scenario: {"median", "p10", "p90", "total", "cpu_median",
    "cpu_p10", "cpu_p90", "cpu_total", "epochs"}}`, empty without both
    contenders.
    """
    ratios = {}
    sums = {}
    for r in runs:
        if r["contender"] != contender:
            continue
        other = next(
            (
                o
                for o in runs
                if o["contender"] == baseline
                and (o["scenario"], o["seed"]) == (r["scenario"], r["seed"])
            ),
            None,
        )
        if other is None:
            continue
        wall, cpu = ratios.setdefault(r["scenario"], ([], []))
        for key, values in (("epoch_seconds", wall), ("epoch_cpu_seconds", cpu)):
            pairs = list(zip(r[key][1:], other[key][1:]))
            values.extend(a / b for a, b in pairs if b > 0)
            total = sums.setdefault((r["scenario"], key), [0.0, 0.0])
            total[0] += sum(a for a, _ in pairs)
            total[1] += sum(b for _, b in pairs)
    summary = {}
    for scenario, (wall, cpu) in ratios.items():
        if not wall or not cpu:
            continue
        summary[scenario] = {"epochs": len(wall)}
        for prefix, values, key in (
            ("", wall, "epoch_seconds"),
            ("cpu_", cpu, "epoch_cpu_seconds"),
        ):
            mine, theirs = sums[(scenario, key)]
            summary[scenario][prefix + "total"] = (
                mine / theirs if theirs > 0 else float("nan")
            )
            summary[scenario][prefix + "median"] = float(np.median(values))
            summary[scenario][prefix + "p10"] = float(np.percentile(values, 10))
            summary[scenario][prefix + "p90"] = float(np.percentile(values, 90))
    return summary


# What each library's pruning adds to its own Keras's step: (pruned, unpruned).
OWN_KERAS = {"maskfit": "keras", "tfmot": "tf_keras"}


def own_cost(runs):
    """Per library: its pruned step time over its own Keras's unpruned one.

    `{library: paired_step_time(runs, library, its Keras)}` for each library
    whose reference ran: what pruning itself costs, apart from the
    difference between the two Keras's steps.
    """
    ran = {r["contender"] for r in runs}
    return {
        library: paired_step_time(runs, library, reference)
        for library, reference in OWN_KERAS.items()
        if library in ran and reference in ran
    }


def _ratio_rows(table):
    """Markdown rows `| scenario | who | median [p10, p90] | CPU | total | epochs |`."""
    lines = []
    for who, rows in table.items():
        for scenario, row in rows.items():
            lines.append(
                f"| {scenario} | {who}"
                f" | {row['median']:.3f} [{row['p10']:.3f}, {row['p90']:.3f}]"
                f" | {row['cpu_median']:.3f} [{row['cpu_p10']:.3f},"
                f" {row['cpu_p90']:.3f}]"
                f" | {row['total']:.3f} / {row['cpu_total']:.3f} | {row['epochs']} |"
            )
    return lines


_RATIO_HEADER = [
    "| scenario | contender | wall-clock ratio, median [p10, p90]"
    " | CPU-time ratio, median [p10, p90] | total time ratio (wall / CPU)"
    " | epoch pairs |",
    "|---|---|---|---|---|---|",
]


def format_markdown(results):
    """The tables of the report: summary, sparsity per pruning step, per seed."""
    lines = ["## Summary", ""]
    lines.append(
        "| scenario | contender | seeds | test accuracy (mean ± std) | step ms (median)"
        " | zeros follow the schedule | pruned weights 0 after each pruning step"
        " | pruned entries revived (mean) | final sparsity per kernel |"
    )
    lines.append("|---|---|---|---|---|---|---|---|---|")
    for row in results["summary"]:
        final = ", ".join(f"{n}: {v:.3f}" for n, v in row["final_sparsity"].items())
        if row.get("pruning", True):
            checks = (
                f" | {'yes' if row['follows_schedule'] else 'NO'}"
                f" | {'yes' if row['pruned_are_zero'] else 'no'}"
                f" | {row['revived_mean']:.1f}"
            )
        else:
            checks = " | - | - | -"
        lines.append(
            f"| {row['scenario']} | {row['contender']} | {row['seeds']}"
            f" | {100 * row['accuracy_mean']:.2f} ± {100 * row['accuracy_std']:.2f}"
            f" | {row['step_ms_median']:.3f}{checks} | {final} |"
        )
    paired = {
        c: rows for c, rows in (results.get("paired_step_time") or {}).items() if rows
    }
    if paired:
        lines += [
            "",
            "Step time over TF-MOT's, epoch by epoch (the contenders train the same"
            " epoch one right after the other; first epochs left out). `keras` and"
            " `tf_keras` are the same model trained without pruning on each Keras,"
            " for reference:",
            "",
        ]
        lines += _RATIO_HEADER + _ratio_rows(paired)
    own = {
        f"{library} / {OWN_KERAS[library]}": rows
        for library, rows in (results.get("own_cost") or {}).items()
        if rows
    }
    if own:
        lines += [
            "",
            "What pruning adds to each Keras's own step: each library's pruned step"
            " time over the same model's unpruned one on the same Keras, epoch by"
            " epoch:",
            "",
        ]
        lines += _RATIO_HEADER + _ratio_rows(own)
    runs = results["runs"]
    for scenario in dict.fromkeys(r["scenario"] for r in runs):
        lines += ["", f"## Zeros per kernel at each pruning step: {scenario}", ""]
        lines.append(
            "Step n is the n-th training batch. A range means the seeds differ."
        )
        lines.append("")
        contenders = list(
            dict.fromkeys(r["contender"] for r in runs if r.get("pruning", True))
        )
        group = [
            r
            for r in runs
            if r["scenario"] == scenario and r["contender"] in contenders
        ]
        names = list(group[0]["kernel_sizes"])
        header = ["step", "schedule sparsity"] + [
            f"{n} ({c})" for n in names for c in contenders
        ]
        lines.append("| " + " | ".join(header) + " |")
        lines.append("|" + "---|" * len(header))
        for index, point in enumerate(group[0]["pruning_steps"]):
            cells = [str(point["step"]), f"{point['schedule_sparsity']:.6f}"]
            for name in names:
                for contender in contenders:
                    values = [
                        r["pruning_steps"][index]["zeros"][name]
                        for r in group
                        if r["contender"] == contender
                        and len(r["pruning_steps"]) > index
                    ]
                    low, high = min(values), max(values)
                    cells.append(str(low) if low == high else f"{low}-{high}")
            lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "## Per seed", ""]
    lines.append(
        "| scenario | seed | contender | test accuracy | step ms | first epoch s |"
    )
    lines.append("|---|---|---|---|---|---|")
    for r in runs:
        lines.append(
            f"| {r['scenario']} | {r['seed']} | {r['contender']}"
            f" | {100 * r['test_accuracy']:.2f} | {r['step_ms']:.3f}"
            f" | {r['first_epoch_s']:.2f} |"
        )
    machine = results["machine"]
    load = ""
    if "load_average_before" in machine:
        before = machine["load_average_before"][0]
        after = machine["load_average_after"][0]
        load = f" Load average (1 min) {before:.2f} before, {after:.2f} after."
    lines += [
        "",
        f"Machine: {machine['platform']}, {machine['cores']} cores;"
        f" {', '.join(f'{k} {v}' for k, v in machine['versions'].items())}.{load}",
        "",
    ]
    return "\n".join(lines)


def _machine():
    from importlib import metadata

    versions = {}
    for package in ("tensorflow", "keras", "tf_keras", "tensorflow-model-optimization"):
        try:
            versions[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            versions[package] = "not installed"
    return {
        "platform": platform.platform(),
        "cores": os.cpu_count(),
        "versions": versions,
    }
