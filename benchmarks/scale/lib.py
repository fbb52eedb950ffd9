"""Every phase of maskfit's cost on a keras_hub Llama, from ~10M to 1.1B parameters.

Issue 43: time and peak memory of each phase at 5 sizes, the largest at
TinyLlama-1.1B's shape (22 blocks, hidden 2048, 32 query / 4 key-value heads,
FFN 5632, vocabulary 32000), and the growth exponent of each phase fitted on
a log-log scale (`cost ~ parameters ** exponent`; the issue asks <= 1.1).
The phases (`measure.PHASES`): building the `LlamaCausalLM`; an `ElementMask`
declared on every kernel; one training step of stock Keras and of
`MaskedModel` (SGD, batch 1 of `sequence` tokens; the phase is the compile
and the first step, which traces, and the table's step time the median of 3
steps of each, interleaved; SGD has no slots, so the 1.1B step fits a 24 GB
machine);
`DependencyGraph`; `select_units(0.5)`; `shrink(uniform=True)`;
`ActivationImportance.calibrate` over 8 batches of 1; the weights file with
the masks saved and loaded. Each size runs in its own process
(`measure.py`), which reports each phase's added peak resident memory.
"""

import dataclasses
import json
import os
import subprocess
import sys

import numpy as np

from benchmarks import harness
from benchmarks.scale import measure

_SHARED = dict(vocabulary_size=32000, sequence=16)
# name: LlamaBackbone arguments (head size 64; key/value heads as TinyLlama's 8:1
# where the query heads allow).
SIZES = {
    "10M": dict(num_layers=2, hidden_dim=128, num_query_heads=2)
    | dict(num_key_value_heads=1, intermediate_dim=352),
    "34M": dict(num_layers=6, hidden_dim=384, num_query_heads=6)
    | dict(num_key_value_heads=2, intermediate_dim=1024),
    "112M": dict(num_layers=10, hidden_dim=768, num_query_heads=12)
    | dict(num_key_value_heads=4, intermediate_dim=2048),
    "365M": dict(num_layers=16, hidden_dim=1280, num_query_heads=20)
    | dict(num_key_value_heads=4, intermediate_dim=3584),
    "1.1B": dict(num_layers=22, hidden_dim=2048, num_query_heads=32)
    | dict(num_key_value_heads=4, intermediate_dim=5632),
    # For the tests: seconds, not a point of the figure.
    "tiny": dict(num_layers=2, hidden_dim=16, num_query_heads=4)
    | dict(num_key_value_heads=2, intermediate_dim=32, vocabulary_size=50),
    "tiny2": dict(num_layers=4, hidden_dim=32, num_query_heads=4)
    | dict(num_key_value_heads=2, intermediate_dim=64, vocabulary_size=100),
}


@dataclasses.dataclass
class Config:
    """What to measure.

    Attributes:
      sizes: Names of `SIZES` to run, smallest first.
      sequence: Tokens per example (batch 1) in the step and calibration.
      processes: Run each size in a process of its own (else in this one).
    """

    sizes: tuple = ("10M", "34M", "112M", "365M", "1.1B")
    sequence: int = 16
    processes: bool = True

    def __post_init__(self):
        self.sizes = tuple(self.sizes)
        unknown = [s for s in self.sizes if s not in SIZES]
        if unknown or len(self.sizes) < 2:
            raise ValueError(
                f"Config sizes must name at least two of {sorted(SIZES)}."
                f" Received: {self.sizes!r}"
            )
        if isinstance(self.sequence, bool) or int(self.sequence) < 2:
            raise ValueError(
                f"Config sequence must be >= 2. Received: {self.sequence!r}"
            )


def size_config(name, sequence):
    """The `LlamaBackbone` arguments of `SIZES[name]`, with `sequence` and `name`."""
    return {**_SHARED, **SIZES[name], "sequence": sequence, "name": name}


def _measure_in_process(size):
    found = measure.measure(size)
    found["pass"] = measure.structured_pass(size)
    return found


def _measure_in_subprocess(size):
    found = _subprocess("all", size)
    found["pass"] = _subprocess("pass", size)
    return found


def _subprocess(part, size):
    return result_of(
        "benchmarks.scale.measure",
        [part, json.dumps(size)],
        f"{part} at size {size['name']}",
    )


def result_of(module, args, what, **env):
    """Runs `python -m module *args` from the project's root; returns the JSON
    it prints last on a line starting `RESULT `.

    Args:
      module: the module to run.
      args: its command-line arguments (strings).
      what: what it measures, for the error.
      **env: variables set for it, beside `TF_CPP_MIN_LOG_LEVEL=2`.

    Raises:
      RuntimeError: if it exits with an error or prints no result.
    """
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", **env)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, env.get("PYTHONPATH")]))
    done = subprocess.run(
        [sys.executable, "-m", module, *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=root,
        check=False,
    )
    lines = [l for l in done.stdout.splitlines() if l.startswith("RESULT ")]
    if done.returncode or not lines:
        raise RuntimeError(
            f"{module}: {what} failed (exit {done.returncode}): {done.stderr[-2000:]}"
        )
    return json.loads(lines[-1][len("RESULT ") :])


def costs(result):
    """`{phase: (seconds, added peak bytes)}` of one size.

    The steps' seconds are their timed steps' (the phase's own include
    compiling and tracing); their memory the first step's.
    """
    found = {
        name: (row["seconds"], row["peak_added_bytes"])
        for name, row in result["phases"].items()
    }
    for name in ("stock", "masked"):
        key = f"step_{name}"
        found[key] = (result["step_seconds"][name], found[key][1])
    return found


# Phases whose work is per masked entry (the kernels' entries): also fitted
# against those, since a small Llama is mostly its embeddings, which carry no mask.
PER_MASKED_ENTRY = ("declare", "step_masked", "save_load")


def exponents(results, against="params"):
    """`{phase: {"seconds": slope, "memory": slope}}`: log-log fits against `against`.

    Args:
      results: one `measure.measure` result per size.
      against: "params" (the model's parameters) or "masked_entries".
    """
    params = np.log([r[against] for r in results])
    table = [costs(r) for r in results]
    found = {}
    for phase in measure.PHASES:
        row = {}
        for i, what in enumerate(("seconds", "memory")):
            values = [c[phase][i] for c in table]
            if any(v is None or v <= 0 for v in values):
                row[what] = None
            else:
                row[what] = float(np.polyfit(params, np.log(values), 1)[0])
        found[phase] = row
    return found


def run(config, workdir):
    """Measures every size; writes scale.json, scale.md and scale.png; returns the results."""
    harness.write_config(workdir, config)
    each = _measure_in_subprocess if config.processes else _measure_in_process
    results = [each(size_config(name, config.sequence)) for name in config.sizes]
    summary = {
        "machine": harness.machine(),
        "sizes": results,
        "exponents": exponents(results),
        "exponents_per_masked_entry": {
            phase: fit
            for phase, fit in exponents(results, "masked_entries").items()
            if phase in PER_MASKED_ENTRY
        },
    }
    harness.write_json(workdir, "scale.json", summary)
    harness.write_text(workdir, "scale.md", format_table(summary))
    figure(summary, os.path.join(workdir, "scale.png"))
    return summary


def format_table(summary):
    """Markdown: per size and phase, seconds and added peak MB; then the exponents."""
    results = summary["sizes"]
    head = "| phase | " + " | ".join(
        f"{r['size']['name']} ({r['params'] / 1e6:.0f}M)" for r in results
    )
    lines = [head + " | exponent (time) | exponent (memory) |"]
    lines.append("|---" * (len(results) + 3) + "|")
    table = [costs(r) for r in results]
    for phase in measure.PHASES:
        cells = []
        for c in table:
            seconds, peak = c[phase]
            mb = "-" if peak is None else f"{peak / 2**20:.0f} MB"
            cells.append(f"{seconds:.3g} s, {mb}")
        fit = summary["exponents"][phase]
        slopes = [
            "-" if fit[k] is None else f"{fit[k]:.2f}" for k in ("seconds", "memory")
        ]
        lines.append(f"| {phase} | " + " | ".join(cells + slopes) + " |")
    ratio = " | ".join(f"{r['step_seconds']['ratio']:.3f}" for r in results)
    lines.append(f"| masked/stock step (median of 3 interleaved) | {ratio} | | |")
    weights = " | ".join(f"{r['weights_bytes'] / 2**20:.0f} MB" for r in results)
    lines.append(f"| weights (float32) | {weights} | | |")
    passes = " | ".join(_pass_cell(r["pass"]) for r in results)
    lines.append(f"| one-shot pass, own process | {passes} | | |")
    per_entry = summary.get("exponents_per_masked_entry", {})
    if per_entry:
        lines.append("")
        lines.append(
            "Against the masked entries (the kernels'): "
            + ", ".join(
                f"{phase} {fit['seconds']:.2f} (time) / {fit['memory']:.2f} (memory)"
                for phase, fit in per_entry.items()
                if fit["seconds"] is not None and fit["memory"] is not None
            )
            + "."
        )
    return "\n".join(lines) + "\n"


def _pass_cell(row):
    """`select_units` + `shrink` on a fresh model: seconds, added peak over the weights."""
    added = row["peak_added_bytes"]
    if added is None:
        return f"{row['seconds']:.3g} s"
    return (
        f"{row['seconds']:.3g} s, +{added / 2**20:.0f} MB"
        f" ({added / row['weights_bytes']:.2f}x weights)"
    )


def figure(summary, path):
    """The log-log figure: seconds and added peak memory of each phase against parameters."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    results = summary["sizes"]
    params = [r["params"] for r in results]
    table = [costs(r) for r in results]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.5))
    for i, (axis, label) in enumerate(
        zip(axes, ("seconds", "added peak memory (bytes)"))
    ):
        for phase in measure.PHASES:
            values = [c[phase][i] for c in table]
            if any(v is None or v <= 0 for v in values):
                continue
            slope = summary["exponents"][phase][("seconds", "memory")[i]]
            axis.loglog(params, values, marker="o", label=f"{phase} ({slope:.2f})")
        axis.set_xlabel("parameters")
        axis.set_ylabel(label)
        axis.grid(True, which="both", alpha=0.3)
        axis.legend(fontsize=7)
    fig.suptitle("maskfit on a keras_hub Llama: cost per phase (fitted exponent)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
