"""Structured pruning side by side: Config, the arms, and `run(config, workdir)`.

Every arm (`ARMS`) gets the same architecture (`experiments.common.structured.models`:
the same layers and initial weights), the same data (`experiments.common.datasets`),
fractions, `round_to`, importance and training budget
(`experiments.common.structured.train.Budget`: optimizer, learning rate, batches in
the same order per seed, the pruning steps at the same training steps), and
returns its records through one interface:

    run_arm(arch, data, fractions, budget, seeds, settings) -> (runs, latency_rows)

`runs` holds one record per (seed, fraction) with at least `framework`,
`seed`, `fraction`, `params`, `macs`, `dense_params`, `dense_macs`,
`test_accuracy`, `dense_accuracy`, `follows_width_rule`, and for a pruning
arm `prune_seconds`; `latency_rows` is `experiments.common.latency.compare`'s
output with the contenders "dense" and each pruned fraction as a string.
The maskfit arm (issue 22's structured pruning) is
`experiments.common.structured.maskfit_arm`; by default the benchmark runs it beside
Torch-Pruning where torch and torch-pruning are installed, alone elsewhere.
"""

import dataclasses
import importlib
import importlib.util
import statistics
import time
from typing import ClassVar

from absl import logging

from benchmarks import harness
from benchmarks.shrunk_latency import lib as shrunk_latency_lib
from experiments.common import report as common_report
from experiments.common.structured.config import StructuredConfig

__all__ = [
    "ARMS",
    "Config",
    "default_frameworks",
    "format_markdown",
    "run",
    "summarize",
]

# Arm name -> the module whose `run_arm` runs it (imported only when used,
# so that an arm's framework is needed only to run that arm).
ARMS = {
    # Torch-Pruning 1.6 (DepGraph) in PyTorch: the reference to match.
    "torch": "benchmarks.structured_vs_torch_pruning.torch_pruning_arm",
    # The dense Keras network and Keras models of the shrunk shapes (no pruning).
    "keras": "benchmarks.structured_vs_torch_pruning.keras_reference_arm",
    # maskfit's structured pruning (issue 22): the arm under test.
    "maskfit": "experiments.common.structured.maskfit_arm",
}


def default_frameworks():
    """`("torch", "maskfit")` where torch and torch-pruning import, else `("maskfit",)`."""
    found = all(importlib.util.find_spec(name) for name in ("torch", "torch_pruning"))
    return ("torch", "maskfit") if found else ("maskfit",)


@dataclasses.dataclass(frozen=True)
class Config(StructuredConfig):
    """What to run; the defaults are issue 23's comparison.

    The fields of `StructuredConfig` (with more seeds, a longer budget and a
    fraction of 0: the unpruned network trained on the same total budget),
    and:

    Attributes:
      fractions: Fractions of each unit group pruned (0: the unpruned reference).
      frameworks: Arms (`ARMS`): maskfit, torch, keras (default: maskfit, and
        torch where installed).
      torch_path: PyTorch inference path: eager, trace, compile
        (`torch_models.TORCH_PATHS`).
      threads: intra_op,inter_op threads of both frameworks (0,0: defaults).
    """

    unpruned_fraction: ClassVar[bool] = True

    fractions: tuple = (0.0, 0.25, 0.5, 0.75)
    seeds: tuple = (0, 1, 2)
    epochs: int = 20
    prune_epochs: int = 5
    prune_steps: int = 5
    finetune_epochs: int = 10
    latency_rounds: int = 20
    threads: tuple = (2, 1)
    frameworks: tuple = default_frameworks()
    torch_path: str = "trace"

    def __post_init__(self):
        super().__post_init__()
        unknown = [f for f in self.frameworks if f not in ARMS]
        if unknown or not self.frameworks:
            raise ValueError(
                f"Received an invalid value for `frameworks`, expected some of"
                f" {sorted(ARMS)}. Received: frameworks={self.frameworks!r}"
            )


def summarize(runs, latency_rows):
    """One row per (dataset, architecture, framework, fraction) over seeds."""
    rows = []

    def key_of(record, fields=("dataset", "architecture", "framework", "fraction")):
        return tuple(record[field] for field in fields)

    for key in sorted({key_of(r) for r in runs}):
        group = [r for r in runs if key_of(r) == key]
        first = group[0]
        row = dict(zip(("dataset", "architecture", "framework", "fraction"), key))
        row.update(
            seeds=len(group),
            params=first["params"],
            macs=first["macs"],
            params_removed=1 - first["params"] / first["dense_params"],
            macs_removed=1 - first["macs"] / first["dense_macs"],
            accuracy=common_report.spread([r["test_accuracy"] for r in group]),
            dense_accuracy=common_report.spread([r["dense_accuracy"] for r in group]),
            follows_width_rule=all(r["follows_width_rule"] for r in group),
        )
        if "prune_seconds" in first and key[3]:
            row["prune_seconds"] = statistics.median(r["prune_seconds"] for r in group)
            row["prune_phase_step_ratio"] = statistics.median(
                r["prune_phase_step_ms"] / r["dense_step_ms"] for r in group
            )
        contender = str(key[3]) if key[3] else None
        for timed in latency_rows:
            where = key_of(timed, ("dataset", "architecture", "framework"))
            if contender and where == key[:3]:
                wall = timed["wall"][contender]
                row[f"latency_ratio_b{timed['batch']}"] = wall["ratio"]["median"]
                row[f"latency_ratio_b{timed['batch']}_p10_p90"] = [
                    wall["ratio"]["p10"],
                    wall["ratio"]["p90"],
                ]
        rows.append(row)
    return rows


def _latency_only(config, latency_rows):
    """Rows for fractions an arm timed but trained no record for (the Keras reference)."""
    rows = []
    for timed in latency_rows:
        for contender, wall in timed["wall"].items():
            if contender == "dense":
                continue
            rows.append(
                {
                    "dataset": timed["dataset"],
                    "architecture": timed["architecture"],
                    "framework": timed["framework"],
                    "fraction": float(contender),
                    "batch": timed["batch"],
                    "dense_ms": timed["wall"]["dense"]["ms"]["median"],
                    "ms": wall["ms"]["median"],
                    "ratio": wall["ratio"]["median"],
                    "ratio_p10_p90": [wall["ratio"]["p10"], wall["ratio"]["p90"]],
                    "cpu_ratio": timed["cpu"][contender]["ratio"]["median"],
                }
            )
    return rows


def run(config, workdir):
    """Runs every arm on every data set and architecture; writes JSON and Markdown.

    Writes `config.json`, `structured_vs_torch_pruning.json` (machine,
    config, runs, latency, summary) and `structured_vs_torch_pruning.md`
    under `workdir`, and returns the results dict.
    """
    shrunk_latency_lib.set_threads(config.threads, config.frameworks)
    harness.write_config(workdir, config)
    before = shrunk_latency_lib.machine()
    runs, latency_rows = [], []
    for name in config.datasets:
        data = config.load(name)
        for kind in config.architectures:
            arch = config.architecture(kind, name)
            for framework in config.frameworks:
                arm = importlib.import_module(ARMS[framework])
                start = time.perf_counter()
                arm_runs, arm_latency = arm.run_arm(
                    arch, data, config.fractions, config.budget, config.seeds, config
                )
                logging.info(
                    "%s %s %s: %d runs in %.0f s",
                    name,
                    kind,
                    framework,
                    len(arm_runs),
                    time.perf_counter() - start,
                )
                where = {"dataset": name, "architecture": kind, "framework": framework}
                runs.extend(dict(r, **where) for r in arm_runs)
                latency_rows.extend(dict(r, **where) for r in arm_latency)
    machine = shrunk_latency_lib.machine()
    machine["load_average_before"] = before["load_average"]
    results = {
        "machine": machine,
        "config": dataclasses.asdict(config),
        "runs": runs,
        "latency": latency_rows,
        "latency_by_fraction": _latency_only(config, latency_rows),
        "summary": summarize(runs, latency_rows),
    }
    harness.write_json(workdir, "structured_vs_torch_pruning.json", results)
    harness.write_text(
        workdir, "structured_vs_torch_pruning.md", format_markdown(results)
    )
    return results


def _percent(value):
    return f"{100 * value:.1f}%"


def format_markdown(results):
    """The summary and the latency ratios as Markdown tables."""
    lines = [
        "| data | network | arm | fraction | seeds | params (removed) | MACs (removed)"
        " | accuracy mean ± std [min, max] | dense accuracy | prune s |",
        "|---|---|---|---:|---:|---:|---:|---|---:|---:|",
    ]
    for row in results["summary"]:
        acc = row["accuracy"]
        prune = row.get("prune_seconds")
        lines.append(
            f"| {row['dataset']} | {row['architecture']} | {row['framework']} |"
            f" {row['fraction']:.2f} | {row['seeds']} |"
            f" {row['params']} ({_percent(row['params_removed'])}) |"
            f" {row['macs']} ({_percent(row['macs_removed'])}) |"
            f" {_percent(acc['mean'])} ± {_percent(acc['std'])}"
            f" [{_percent(acc['min'])}, {_percent(acc['max'])}] |"
            f" {_percent(row['dense_accuracy']['mean'])} |"
            f" {'-' if prune is None else f'{prune:.3f}'} |"
        )
    lines += [
        "",
        "| data | network | arm | fraction | batch | dense ms | shrunk ms |"
        " shrunk/dense [p10, p90] | CPU-time ratio |",
        "|---|---|---|---:|---:|---:|---:|---|---:|",
    ]
    for row in results["latency_by_fraction"]:
        low, high = row["ratio_p10_p90"]
        lines.append(
            f"| {row['dataset']} | {row['architecture']} | {row['framework']} |"
            f" {row['fraction']:.2f} | {row['batch']} | {row['dense_ms']:.3f} |"
            f" {row['ms']:.3f} | {row['ratio']:.3f} [{low:.3f}, {high:.3f}] |"
            f" {row['cpu_ratio']:.3f} |"
        )
    return "\n".join(lines) + "\n"
