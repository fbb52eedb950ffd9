"""One table of what `benchmarks/gpu.sh` measured: step ratios, then the 1.1B shrink.

`python -m benchmarks.scale.gpu_table WORKDIR` reads the `jax_step_time.json`
of each `WORKDIR/step_*` run and `WORKDIR/latency/latency.json`
(`benchmarks.scale.latency`) and prints them as one Markdown table, with
the device, the date and what issue 43 asks of each ratio.
"""

import datetime
import glob
import json
import os
import sys

# Issue 43: masked / stock on a GPU.
BARS = {"output": 1.02, "element": 1.04}


def _load(path):
    with open(path) as f:
        return json.load(f)


def _model(config):
    if "bert" in config["models"]:
        return (
            f"BERT {config['bert_layers']}x{config['bert_hidden']}"
            f" (seq {config['bert_sequence']}, batch {config['bert_batch']})"
        )
    return (
        f"MLP {config['mlp_depth']}x{config['mlp_width']} (batch {config['mlp_batch']})"
    )


def table(workdir, device=None):
    """The Markdown table of the runs under `workdir`."""
    lines = [
        f"{datetime.date.today().isoformat()}, {device or 'device not given'}",
        "",
        "| what | stock ms | masked/stock | bar | fusions ratio | bytes ratio |",
        "|---|---|---|---|---|---|",
    ]
    for folder in sorted(glob.glob(os.path.join(workdir, "step_*"))):
        config = _load(os.path.join(folder, "config.json"))
        rows = _load(os.path.join(folder, "jax_step_time.json"))["rows"]
        stock = next(r for r in rows if r["mask"] == "none")
        for row in rows:
            if row["mask"] == "none":
                continue
            bar = BARS.get(row["mask"])
            verdict = (
                ""
                if bar is None
                else f"<= {bar} {'yes' if row['ratio_median'] <= bar else 'NO'}"
            )
            # What XLA compiled, beside the times (benchmarks.hlo), when measured.
            hlo = [row.get("fusions_ratio"), row.get("bytes_ratio")]
            hlo = ["" if x is None else f"{x:.4f}" for x in hlo]
            lines.append(
                f"| {_model(config)}, {row['mask']} | {stock['step_ms']:.3g} |"
                f" {row['ratio_median']:.3f} | {verdict} | {hlo[0]} | {hlo[1]} |"
            )
    path = os.path.join(workdir, "latency", "latency.json")
    if os.path.exists(path):
        summary = _load(path)
        lines.append(
            f"| shrink {summary['params'] / 1e6:.0f}M -> "
            f"{summary['shrunk_params'] / 1e6:.0f}M ({summary['class']}), logits"
            f" within {summary['logits_error']:.1e} | | | | | |"
        )
        for row in summary["rows"]:
            lines.append(
                f"| shrunk/dense latency, {row['dtype']}, batch {row['batch']} |"
                f" {row['dense_ms']:.3g} | {row['ratio']:.3f} | | | |"
            )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(table(sys.argv[1], os.environ.get("GPU_SH_DEVICE")))
