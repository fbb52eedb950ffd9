"""The LLM-compression experiment's summary, tables and figure."""

from experiments.common import report

__all__ = ["format_tables", "plot", "side_by_side", "summarize"]

PEER = "llmcompressor"


def _framework(row):
    return row.get("framework", "maskfit")


def summarize(runs):
    """One row per (framework, method, target): perplexity, healed, time, memory.

    Rows of a method the peer could not run (a `failure`) are left out here;
    `side_by_side` shows their errors.
    """
    runs = [r for r in runs if "failure" not in r]
    keys = []
    for r in runs:
        if (_framework(r), r["method"], r["target"]) not in keys:
            keys.append((_framework(r), r["method"], r["target"]))
    rows = []
    for framework, method, target in keys:
        chosen = [
            r for r in runs
            if (_framework(r), r["method"], r["target"]) == (framework, method, target)
        ]  # fmt: skip
        row = {
            "framework": framework,
            "method": method,
            "target": target,
            "seeds": len(chosen),
            "perplexity": report.spread([r["perplexity"] for r in chosen]),
        }
        for name in ("healed_perplexity", "seconds", "peak_bytes", "sparsity", "error"):
            values = [r[name] for r in chosen if name in r]
            if values:
                row[name] = report.spread(values)
        rows.append(row)
    return rows


def _ratio(pairs):
    return report.spread([a / b for a, b in pairs]) if pairs else None


def side_by_side(runs):
    """Per (method, target) the peer ran: both frameworks on each seed's weights.

    `perplexity_ratio` and `seconds_ratio` are maskfit's over llmcompressor's,
    per seed (their spread), `cpu_ratio` the same of CPU seconds; `within_1pct`: maskfit's perplexity at most 1%
    above llmcompressor's on every seed; `no_longer`: maskfit's one-shot
    pass no longer than llmcompressor's on every seed (wall time;
    `no_longer_cpu`: CPU time). A method llmcompressor
    could not run carries its error (`failure`) instead.
    """
    mine = {(r["method"], r["target"], r["seed"]): r for r in runs
            if _framework(r) == "maskfit"}  # fmt: skip
    theirs = [r for r in runs if _framework(r) == PEER]
    keys = []
    for r in theirs:
        if (r["method"], r["target"]) not in keys:
            keys.append((r["method"], r["target"]))
    rows = []
    for method, target in keys:
        peer = [r for r in theirs if (r["method"], r["target"]) == (method, target)]
        row = {"method": method, "target": target, "seeds": len(peer)}
        errors = sorted({r["failure"] for r in peer if "failure" in r})
        if errors:
            row["failure"] = " / ".join(errors)
        pairs = [(mine[(method, target, r["seed"])], r) for r in peer
                 if "failure" not in r and (method, target, r["seed"]) in mine]  # fmt: skip
        if not pairs:
            rows.append(row)
            continue
        for name, key in (("maskfit", 0), (PEER, 1)):
            row[name] = {
                field: report.spread([p[key][field] for p in pairs])
                for field in ("perplexity", "seconds", "cpu_seconds", "sparsity")
                if all(field in p[key] for p in pairs)
            }
        ratios = [(a["perplexity"], b["perplexity"]) for a, b in pairs]
        row["perplexity_ratio"] = _ratio(ratios)
        if method != "dense":
            row["seconds_ratio"] = _ratio(
                [(a["seconds"], b["seconds"]) for a, b in pairs]
            )
            row["within_1pct"] = all(a <= 1.01 * b for a, b in ratios)
            row["no_longer"] = all(a["seconds"] <= b["seconds"] for a, b in pairs)
            if all("cpu_seconds" in a and "cpu_seconds" in b for a, b in pairs):
                cpu = [(a["cpu_seconds"], b["cpu_seconds"]) for a, b in pairs]
                row["cpu_ratio"] = _ratio(cpu)
                row["no_longer_cpu"] = all(a <= b for a, b in cpu)
        else:
            row["logits_max_difference"] = max(
                b["logits_max_difference"] for _, b in pairs
            )
            row["logits_scale"] = min(b["logits_scale"] for _, b in pairs)
        rows.append(row)
    return rows


def _side_by_side_lines(rows):
    if not rows:
        return []
    dense = [r for r in rows if r["method"] == "dense" and PEER in r]
    lines = ["", "Side by side with llmcompressor (each seed's same dense weights,"
             " calibration and validation windows; ratios are maskfit / llmcompressor"
             " per seed, mean [min, max]):", ""]  # fmt: skip
    if dense:
        d = dense[0]
        lines[-1:] = [
            f" Dense: maskfit {report.cell(d['maskfit']['perplexity'], digits=3)},"
            f" Hugging Face {report.cell(d[PEER]['perplexity'], digits=3)}; largest"
            f" logit difference {d['logits_max_difference']:.2e} (logits up to"
            f" {d['logits_scale']:.1f}).",
            "",
        ]
    table = []
    for r in rows:
        if r["method"] == "dense":
            continue
        if PEER not in r:
            table.append([r["method"], r["target"], "-", "-", "-", "-", "-", "-", "-",
                          "-", "-", f"error: {r.get('failure', '?')}", "-"])  # fmt: skip
            continue
        mine, theirs = r["maskfit"], r[PEER]
        table.append([
            r["method"], r["target"],
            report.cell(mine["perplexity"], digits=3),
            report.cell(theirs["perplexity"], digits=3),
            report.cell(r["perplexity_ratio"], digits=4),
            report.cell(theirs["sparsity"], 100, 1),
            report.cell(mine["seconds"], digits=1),
            report.cell(theirs["seconds"], digits=1),
            report.cell(r["seconds_ratio"], digits=2),
            report.cell(r["cpu_ratio"], digits=2) if "cpu_ratio" in r else "-",
            "yes" if r["within_1pct"] else "no",
            ("yes" if r["no_longer"] else "no")
            + (f"; error: {r['failure']}" if "failure" in r else ""),
            {True: "yes", False: "no", None: "-"}[r.get("no_longer_cpu")],
        ])  # fmt: skip
    return lines + report.markdown_table(
        ["method", "target", "maskfit ppl", "llmcompressor ppl", "ppl ratio",
         "llmcompressor sparsity", "maskfit s", "llmcompressor s", "time ratio",
         "CPU time ratio", "within 1%", "no longer (wall)", "no longer (CPU)"],
        table)  # fmt: skip


def _cell(row, name, scale=1.0, digits=2):
    return report.cell(row[name], scale, digits) if name in row else "-"


def format_tables(metrics):
    """The run's tables as Markdown: perplexity per method and target, then quantization."""
    summary = [r for r in metrics["summary"] if r.get("framework") != PEER]
    lines = [
        "# One-shot pruning of a trained Llama: perplexity, mean [min, max] over seeds",
        "",
    ]
    lines += report.markdown_table(
        ["method", "target", "sparsity", "perplexity", "healed", "output error",
         "one-shot s", "peak NumPy MiB"],  # fmt: skip
        [
            [
                r["method"], r["target"], _cell(r, "sparsity", 100, 1),
                _cell(r, "perplexity"), _cell(r, "healed_perplexity"),
                _cell(r, "error", 1.0, 3), _cell(r, "seconds"),
                _cell(r, "peak_bytes", 2.0**-20, 1),
            ]
            for r in summary
        ],
    )  # fmt: skip
    quantized = [r for r in metrics["runs"] if r.get("quantized")]
    if quantized:
        dense = metrics["runs"][0]
        lines += [
            "",
            f"Quantized after pruning, seed {quantized[0]['seed']} (dense float32 file:"
            f" {dense.get('file_bytes', 0) / 2**20:.2f} MiB):",
            "",
        ]
        lines += report.markdown_table(
            ["method", "target", "mode", "pruned zeros kept", "perplexity", "file MiB"],
            [
                [
                    r["method"], r["target"], q["mode"],
                    f"{q['zeros_kept']} / {q['pruned']}", f"{q['perplexity']:.2f}",
                    f"{q['file_bytes'] / 2**20:.2f}",
                ]
                for r in quantized
                for q in r["quantized"]
            ],
        )  # fmt: skip
    lines += _side_by_side_lines(metrics.get("side_by_side", []))
    stages = metrics.get("stages", {})
    if stages:
        lines += ["", "Where the time went (this process; s wall / s CPU):", ""]
        lines += report.markdown_table(
            ["stage", "wall s", "CPU s"],
            [[k, f"{v['seconds']:.0f}", f"{v['cpu_seconds']:.0f}"]
             for k, v in stages.items()],
        )  # fmt: skip
    lines += ["", f"{metrics['seconds']:.0f} s in all"
              + (f", {metrics['cpu_seconds']:.0f} s of CPU." if "cpu_seconds" in metrics
                 else ".")]  # fmt: skip
    return "\n".join(lines) + "\n"


def _x(target):
    if target.endswith("%"):
        return float(target[:-1]) / 100
    n, m = (int(p) for p in target.split(":"))
    return n / m


def plot(metrics, path):
    """Perplexity against sparsity per method (N:M as open markers), healed dashed.

    llmcompressor's models, where the run has them, are crosses in their
    method's color, at the sparsity they have.
    """
    fig = report.new_figure((7, 4.5))
    if fig is None:
        return None
    axes = fig.add_subplot()
    summary = [r for r in metrics["summary"] if r.get("framework") != PEER]
    peer = [r for r in metrics["summary"] if r.get("framework") == PEER]
    dense = [r for r in summary if r["method"] == "dense"]
    if dense:
        axes.axhline(dense[0]["perplexity"]["mean"], color="gray", lw=1, label="dense")
    for index, method in enumerate(sorted({r["method"] for r in summary} - {"dense"})):
        color = f"C{index}"
        rows = [r for r in summary if r["method"] == method]
        flat = sorted(
            (r for r in rows if r["target"].endswith("%")),
            key=lambda r: _x(r["target"]),
        )
        if flat:
            report.error_bars(axes, [_x(r["target"]) for r in flat],
                              [r["perplexity"] for r in flat], color=color, label=method)  # fmt: skip
        healed = [r for r in flat if "healed_perplexity" in r]
        if healed:
            report.error_bars(axes, [_x(r["target"]) for r in healed],
                              [r["healed_perplexity"] for r in healed], color=color,
                              linestyle="--", label=f"{method}, healed")  # fmt: skip
        for r in rows:
            if ":" in r["target"]:
                axes.plot([_x(r["target"])], [r["perplexity"]["mean"]], marker="s",
                          markerfacecolor="none", color=color, linestyle="none")  # fmt: skip
                axes.annotate(r["target"], (_x(r["target"]), r["perplexity"]["mean"]),
                              fontsize=7, xytext=(3, 3), textcoords="offset points")  # fmt: skip
        theirs = [r for r in peer if r["method"] == method and "sparsity" in r]
        if theirs:
            axes.plot([r["sparsity"]["mean"] for r in theirs],
                      [r["perplexity"]["mean"] for r in theirs], marker="x",
                      color=color, linestyle="none", label=f"{method}, {PEER}")  # fmt: skip
    axes.set_yscale("log")
    axes.set_xlabel(
        "sparsity of the pruned kernels (squares: N:M; crosses: llmcompressor)"
    )
    axes.set_ylabel("validation perplexity (bytes)")
    axes.legend(fontsize=8)
    return report.save_figure(fig, path, "One-shot pruning of a small trained Llama")
