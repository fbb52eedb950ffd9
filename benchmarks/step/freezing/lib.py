"""Freezing by mask against `trainable=False`: step time and memory (issue 13).

The model is a ReLU MLP (`depth` Dense layers of `width` units, then Dense(10))
trained with AdamW; its first `frozen_layers` layers are frozen five ways:

- `trainable_false`: `layer.trainable = False` on a stock `keras.Model`;
- `output_zeros`: `OutputMask` of zeros on a `MaskedModel`;
- `element_zeros`: `ElementMask` of zeros on every variable of those layers;
- `piecewise_frozen`: the frozen interval of a `PiecewiseMask` that unfreezes
  the layers at a step far ahead;
- `piecewise_unfrozen`: the same schedule after its boundary, against
  `stock_all`, a stock model with every layer trainable.

Step times are paired and interleaved as in `benchmarks.harness`; memory is
the peak resident-set growth during `fit`, each contender in a process of
its own (Linux: /proc/self/status, peak reset through /proc/self/clear_refs).
The memory runs add two partly masked models against `stock_all`, for what the
masking stage itself holds: `output_half` (every other unit of every hidden
layer frozen) and `element_90` (90% of every hidden kernel's entries frozen).
"""

import dataclasses
import json
import os
import re
import statistics
import subprocess
import sys

import keras
import numpy as np

import maskfit
from benchmarks import harness

FROZEN = ("trainable_false", "output_zeros", "element_zeros", "piecewise_frozen")
UNFROZEN = ("stock_all", "piecewise_unfrozen")
CONTENDERS = FROZEN + UNFROZEN
PARTIAL = ("output_half", "element_90")
MEMORY = FROZEN + ("stock_all",) + PARTIAL
BASELINES = {name: "trainable_false" for name in FROZEN}
BASELINES.update({name: "stock_all" for name in UNFROZEN + PARTIAL})
# A boundary no timed step reaches: the frozen interval of the schedule.
FAR = 10**9


@dataclasses.dataclass
class Config(harness.TimingConfig, steps_per_execution=10, warmup_steps=20, repeats=10):
    """What to measure; the defaults are issue 13's.

    The timing fields and `seed` of `harness.TimingConfig`, and:

    Attributes:
      depth: Hidden Dense layers (step time).
      width: Units per hidden layer (step time).
      batch: Batch size.
      frozen_layers: Layers frozen, from the first.
      jit_compile: Compile the steps with XLA.
      memory_width: Units per layer (memory).
      memory_steps: Steps of the memory runs.
      memory_contenders: Contenders whose memory is measured.
    """

    depth: int = 4
    width: int = 1024
    batch: int = 256
    frozen_layers: int = 3
    jit_compile: bool = False
    memory_width: int = 2048
    memory_steps: int = 30
    memory_contenders: tuple = MEMORY


def build(config, name, width=None):
    """Returns `(model, x, y)`: contender `name`, compiled."""
    width = width or config.width
    keras.utils.set_random_seed(config.seed)
    inputs = keras.Input((width,))
    hidden, layers = inputs, []
    for _ in range(config.depth):
        layers.append(keras.layers.Dense(width, activation="relu"))
        hidden = layers[-1](hidden)
    outputs = keras.layers.Dense(10)(hidden)
    stock = name in ("trainable_false", "stock_all")
    model = (keras.Model if stock else maskfit.MaskedModel)(inputs, outputs)
    # The unfrozen contender crosses its boundary during the warm-up steps.
    boundary = FAR if name == "piecewise_frozen" else max(1, config.warmup_steps // 2)
    rng = np.random.default_rng(config.seed + 1)
    for layer in layers:
        if name == "output_half":
            maskfit.set_mask(layer, maskfit.OutputMask(np.arange(width) % 2))
        elif name == "element_90":
            keep = rng.random((width, width)) >= 0.9
            maskfit.set_mask(layer, maskfit.ElementMask({"kernel": keep}))
    for layer in layers[: config.frozen_layers]:
        if name == "trainable_false":
            layer.trainable = False
        elif name == "output_zeros":
            maskfit.set_mask(layer, maskfit.OutputMask([0] * width))
        elif name == "element_zeros":
            zeros = {"kernel": np.zeros((1, 1)), "bias": np.zeros((1,))}
            maskfit.set_mask(layer, maskfit.ElementMask(zeros))
        elif name.startswith("piecewise"):
            schedule = maskfit.PiecewiseMask(
                [boundary],
                [maskfit.OutputMask([0] * width), maskfit.OutputMask([1] * width)],
            )
            maskfit.set_mask(layer, schedule)
    model.compile(
        optimizer=keras.optimizers.AdamW(1e-4, weight_decay=0.004),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        steps_per_execution=config.steps_per_execution,
        jit_compile=config.jit_compile,
    )
    rng = np.random.default_rng(config.seed)
    x = rng.standard_normal((config.batch, width)).astype(np.float32)
    y = rng.integers(0, 10, size=(config.batch,)).astype(np.int32)
    return model, x, y


def time_contenders(config):
    """Returns `{name: {"step_ms", "ratio", "ratio_min", "ratio_max", "baseline"}}`."""
    contenders = []
    for name in CONTENDERS:
        model, x, y = build(config, name)
        contenders.append(harness.Timed.of_config(name, model, x, y, config))
    times, _ = harness.round_robin(contenders, config.repeats)
    results = {}
    for name in CONTENDERS:
        ratio, low, high = harness.paired_ratios(times, name, BASELINES[name])
        results[name] = {
            "step_ms": 1e3 * statistics.median(times[name]),
            "ratio": ratio,
            "ratio_min": low,
            "ratio_max": high,
            "baseline": BASELINES[name],
        }
    return results


def _kib(field):
    with open("/proc/self/status") as f:
        return int(re.search(rf"{field}:\s+(\d+)", f.read()).group(1))


def peak_growth(config, name):
    """Peak resident-set growth (bytes) during `fit` of contender `name`, in this process."""
    model, x, y = build(config, name, width=config.memory_width)
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # resets the peak (VmHWM) to the current size
    before = _kib("VmRSS")
    model.fit(
        x,
        y,
        batch_size=config.batch,
        epochs=config.memory_steps,
        shuffle=False,
        verbose=0,
    )
    return 1024 * (_kib("VmHWM") - before)


def measure_memory(config):
    """Runs `peak_growth` for each contender in a process of its own."""
    growth = {}
    for name in config.memory_contenders:
        command = [
            sys.executable,
            "-m",
            "benchmarks.freezing",
            f"--memory_contender={name}",
            f"--config_json={json.dumps(dataclasses.asdict(config))}",
        ]
        env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
        output = subprocess.run(
            command, capture_output=True, text=True, check=True, env=env
        ).stdout
        growth[name] = int(output.strip().splitlines()[-1])
    return growth


def run(config, workdir):
    """Times and measures every contender; writes `freezing.json` and `freezing.md`."""
    os.makedirs(workdir, exist_ok=True)
    results = {
        "config": dataclasses.asdict(config),
        "machine": harness.machine(),
        "time": time_contenders(config),
        "memory": measure_memory(config),
    }
    harness.write_json(workdir, "freezing.json", results)
    table = format_table(results)
    harness.write_text(workdir, "freezing.md", table + "\n")
    return results


def format_table(results):
    """A markdown table: step time and memory growth, each as a ratio to its baseline."""
    memory, times = results["memory"], results["time"]
    lines = [
        "| contender | baseline | ms/step (median) | step-time ratio [min, max]"
        " | peak memory growth in fit | memory ratio |",
        "|---|---|---|---|---|---|",
    ]
    for name in CONTENDERS + PARTIAL:
        cells = [name, BASELINES[name]]
        row = times.get(name)
        if row is None:
            cells += ["", ""]
        else:
            cells += [
                f"{row['step_ms']:.2f}",
                f"{row['ratio']:.3f} [{row['ratio_min']:.3f}, {row['ratio_max']:.3f}]",
            ]
        grown, base = memory.get(name), memory.get(BASELINES[name])
        if grown is None:
            cells += ["", ""]
        else:
            cells += [f"{grown / 2**20:.1f} MiB", f"{grown / base:.2f}" if base else ""]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)
