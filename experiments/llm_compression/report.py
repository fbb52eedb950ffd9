"""The LLM-compression experiment's summary, tables and figure."""

from experiments.common import report

__all__ = ["format_tables", "plot", "summarize"]


def summarize(runs):
    """One row per (method, target): perplexity before and after healing, time, memory."""
    keys = []
    for r in runs:
        if (r["method"], r["target"]) not in keys:
            keys.append((r["method"], r["target"]))
    rows = []
    for method, target in keys:
        chosen = [r for r in runs if (r["method"], r["target"]) == (method, target)]
        row = {
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


def _cell(row, name, scale=1.0, digits=2):
    return report.cell(row[name], scale, digits) if name in row else "-"


def format_tables(metrics):
    """The run's tables as Markdown: perplexity per method and target, then quantization."""
    summary = metrics["summary"]
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
    lines += ["", f"{metrics['seconds']:.0f} s in all."]
    return "\n".join(lines) + "\n"


def _x(target):
    if target.endswith("%"):
        return float(target[:-1]) / 100
    n, m = (int(p) for p in target.split(":"))
    return n / m


def plot(metrics, path):
    """Perplexity against sparsity per method (N:M as open markers), healed dashed."""
    fig = report.new_figure((7, 4.5))
    if fig is None:
        return None
    axes = fig.add_subplot()
    summary = metrics["summary"]
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
    axes.set_yscale("log")
    axes.set_xlabel("sparsity of the pruned kernels (squares: N:M)")
    axes.set_ylabel("validation perplexity (bytes)")
    axes.legend(fontsize=8)
    return report.save_figure(fig, path, "One-shot pruning of a small trained Llama")
