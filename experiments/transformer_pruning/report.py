"""The transformer-pruning experiment's summary, tables and figure."""

from experiments.common import report

__all__ = ["format_tables", "plot", "side_by_side", "summarize"]


def summarize(runs):
    """One row per (arm, schedule, importance, fraction): params and perplexity over seeds."""
    keys = []
    for r in runs:
        key = (r["arm"], r["schedule"], r["importance"], r["fraction"])
        if key not in keys:
            keys.append(key)
    rows = []
    for arm, schedule, importance, fraction in keys:
        chosen = [
            r
            for r in runs
            if (r["arm"], r["schedule"], r["importance"], r["fraction"])
            == (arm, schedule, importance, fraction)
        ]
        rows.append(
            {
                "arm": arm,
                "schedule": schedule,
                "importance": importance,
                "fraction": fraction,
                "params": sorted({r["params"] for r in chosen}),
                "removed": sorted({r.get("removed", 0) for r in chosen}),
                "perplexity": report.spread([r["perplexity"] for r in chosen]),
                "seeds": len(chosen),
            }
        )
    return rows


def _ratio(metrics, framework, fraction, batch):
    for row in metrics["latency"]:
        if (row["framework"], row["fraction"], row["batch"]) == (
            framework,
            fraction,
            batch,
        ):
            return row["ratio"]["median"]
    return None


def _cell(value, digits=2):
    return "-" if value is None else f"{value:.{digits}f}"


def _frameworks(metrics, arm):
    if arm == "torch_pruning":
        return ["torch"]
    return sorted({r["framework"] for r in metrics["latency"]} - {"torch"})


def side_by_side(metrics):
    """Per fraction: maskfit (one-shot magnitude) against Torch-Pruning, the issue's targets."""
    summary = {(r["arm"], r["schedule"], r["importance"], r["fraction"]): r
               for r in metrics["summary"]}  # fmt: skip
    rows = []
    batches = sorted({r["batch"] for r in metrics["latency"]})
    for (arm, schedule, importance, fraction), row in summary.items():
        if arm != "maskfit" or schedule != "one_shot" or importance != "magnitude":
            continue
        peer = summary.get(("torch_pruning", "one_shot", "magnitude", fraction))
        if peer is None:
            continue
        ours, theirs = row["perplexity"]["mean"], peer["perplexity"]["mean"]
        entry = {
            "fraction": fraction,
            "removed": row["removed"],
            "removed_torch_pruning": peer["removed"],
            "perplexity": ours,
            "perplexity_torch_pruning": theirs,
            "perplexity_ratio": ours / theirs,
        }
        for batch in batches:
            entry[f"torch_ratio_b{batch}"] = _ratio(metrics, "torch", fraction, batch)
            for path in _frameworks(metrics, "maskfit"):
                entry[f"{path}_ratio_b{batch}"] = _ratio(metrics, path, fraction, batch)
        rows.append(entry)
    return rows


def format_tables(metrics):
    """The run's Markdown: every arm's rows, then the side by side."""
    batches = sorted({r["batch"] for r in metrics["latency"]})
    paths = sorted({r["framework"] for r in metrics["latency"]})
    header = ["arm", "schedule", "importance", "fraction", "params", "removed params",
              "val. perplexity mean [min, max]"]  # fmt: skip
    header += [f"{p} b{b}" for p in paths for b in batches]
    rows = []
    for r in metrics["summary"]:
        frameworks = _frameworks(metrics, r["arm"])
        cells = [r["arm"], r["schedule"], r["importance"], f"{r['fraction']:.0%}",
                 "/".join(map(str, r["params"])), "/".join(map(str, r["removed"])),
                 report.cell(r["perplexity"], digits=3)]  # fmt: skip
        for path in paths:
            for batch in batches:
                value = None
                if path in frameworks and r["fraction"] > 0:
                    value = _ratio(metrics, path, r["fraction"], batch)
                cells.append(_cell(value))
        rows.append(cells)
    lines = [
        f"Validation perplexity (bytes) over {max(r['seeds'] for r in metrics['summary'])}"
        " seeds; latency as the shrunk model's time over its own framework's dense"
        " model's (median of paired interleaved rounds, one thread, seed 0's models).",
        "",
    ]
    lines += report.markdown_table(header, rows)
    pairs = side_by_side(metrics)
    if pairs:
        lines += [
            "",
            "Side by side (maskfit one-shot magnitude against Torch-Pruning):",
            "",
        ]
        head = ["fraction", "removed params (maskfit / TP)", "perplexity (maskfit / TP)",
                "ratio"]  # fmt: skip
        keys = [k for k in pairs[0] if k.endswith(tuple(f"_b{b}" for b in batches))]
        head += [k.replace("_ratio_", " ") for k in keys]
        body = [
            [f"{p['fraction']:.0%}",
             f"{p['removed']} / {p['removed_torch_pruning']}",
             f"{p['perplexity']:.3f} / {p['perplexity_torch_pruning']:.3f}",
             f"{p['perplexity_ratio']:.3f}"]
            + [_cell(p[k]) for k in keys]
            for p in pairs
        ]  # fmt: skip
        lines += report.markdown_table(head, body)
    elif metrics.get("torch_arm", "ran") != "ran":
        lines += ["", f"Torch-Pruning arm {metrics['torch_arm']}."]
    return "\n".join(lines) + "\n"


def plot(metrics, path):
    """Perplexity against the shrunk/dense latency ratio (the largest batch timed)."""
    fig = report.new_figure((7, 4.5))
    if fig is None:
        return None
    axes = fig.subplots()
    batch = max(r["batch"] for r in metrics["latency"])
    series = {}
    for r in metrics["summary"]:
        if r["schedule"].startswith("dense"):
            continue
        framework = "torch" if r["arm"] == "torch_pruning" else "tensorflow"
        if not any(row["framework"] == framework for row in metrics["latency"]):
            framework = _frameworks(metrics, r["arm"])[0]
        ratio = _ratio(metrics, framework, r["fraction"], batch)
        label = f"{r['arm']} {r['schedule']} {r['importance']} ({framework})"
        series.setdefault(label, []).append((ratio, r["perplexity"]))
    for label, points in series.items():
        points = sorted(p for p in points if p[0] is not None)
        if points:
            report.error_bars(axes, [p[0] for p in points], [p[1] for p in points],
                              label=label)  # fmt: skip
    for r in metrics["summary"]:
        if r["schedule"].startswith("dense"):
            style = ":" if r["schedule"] == "dense" else "--"
            axes.axhline(r["perplexity"]["mean"], color="gray", lw=0.8, ls=style)
    axes.set_xlabel(f"shrunk / dense latency, batch {batch} (own framework)")
    axes.set_ylabel("validation perplexity (bytes)")
    axes.legend(fontsize=6)
    return report.save_figure(
        fig,
        path,
        "Llama causal LM: heads and FFN units pruned, healed, shrunk",
        fontsize=9,
    )
