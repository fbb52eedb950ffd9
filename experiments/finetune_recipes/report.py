"""The finetune_recipes experiment's summary, table and figure."""

import os

import numpy as np

__all__ = ["summarize", "table", "write"]

LABELS = {
    "full": "full fine-tuning",
    "head": "head only",
    "bitfit": "BitFit (+ head)",
    "layerwise": "layer-wise decay",
    "gradual": "gradual unfreezing",
    "sparse_1": "sparse 1% (LT-SFT)",
    "sparse_10": "sparse 10% (LT-SFT)",
    "lp_ft": "linear probe, then full",
}


def summarize(methods):
    """`{method: {...}}` with each method's mean, spread and ratios to full."""
    full = methods["full"]["runs"]
    full_ms = float(np.mean([r["step_ms"] for r in full]))
    full_rss = methods["full"]["peak_rss_mb"]
    summary = {}
    for name, result in methods.items():
        runs = result["runs"]
        accuracy = [r["accuracy"] for r in runs]
        step_ms = float(np.mean([r["step_ms"] for r in runs]))
        rss = result["peak_rss_mb"]
        summary[name] = {
            "runs": runs,
            "accuracy_mean": float(np.mean(accuracy)),
            "accuracy_std": float(np.std(accuracy)),
            "learnable": runs[0]["learnable"],
            "learnable_fraction": runs[0]["learnable"] / runs[0]["total"],
            "step_ms": step_ms,
            "step_time_vs_full": step_ms / full_ms,
            "peak_rss_mb": rss,
            "peak_rss_vs_full": None if rss is None or not full_rss else rss / full_rss,
        }
    return summary


def table(metrics):
    """The results as a markdown table."""
    rows = [
        "| method | accuracy (mean ± std) | learnable entries | step ms | step time / full"
        " | peak RSS MB | peak RSS / full |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for name, m in metrics["methods"].items():
        rss = "-" if m["peak_rss_mb"] is None else f"{m['peak_rss_mb']:.0f}"
        rss_ratio = (
            "-" if m["peak_rss_vs_full"] is None else f"{m['peak_rss_vs_full']:.3f}"
        )
        rows.append(
            f"| {LABELS[name]} | {100 * m['accuracy_mean']:.1f} ±"
            f" {100 * m['accuracy_std']:.1f} | {m['learnable']:,}"
            f" ({100 * m['learnable_fraction']:.2f}%) | {m['step_ms']:.1f}"
            f" | {m['step_time_vs_full']:.3f} | {rss} | {rss_ratio} |"
        )
    return "\n".join(rows) + "\n"


def write(metrics, workdir):
    """Writes `results.md` and `results.png` under `workdir`."""
    with open(os.path.join(workdir, "results.md"), "w") as f:
        f.write(table(metrics))
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    figure, axes = plt.subplots(figsize=(7, 4.5))
    for name, m in metrics["methods"].items():
        axes.errorbar(
            100 * m["learnable_fraction"],
            100 * m["accuracy_mean"],
            yerr=100 * m["accuracy_std"],
            fmt="o",
            capsize=3,
            label=LABELS[name],
        )
    axes.axhline(100 * metrics["chance"], color="grey", linestyle=":", label="chance")
    axes.set_xscale("log")
    axes.set_xlabel("learnable entries at the end (% of the model)")
    axes.set_ylabel("test accuracy (%), mean ± std over seeds")
    axes.set_title(
        "Fine-tuning recipes on a byte-level GPT-2 (code, docstring or comment?)"
    )
    axes.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(os.path.join(workdir, "results.png"), dpi=120)
    plt.close(figure)
