"""What the benchmarks share: timed contenders in turn, paired ratios, the machine.

Each benchmark's `Config` takes its timing settings from `TimingConfig`,
builds its contenders as `Timed` (one compiled model and a
fixed batch; `optimizer` makes the step-time benchmarks' optimizers by name),
times them with `round_robin`, reports `paired_ratios` against its baseline
(`ratio_row` holds a contender's step time and ratios, `log_ratio_row` logs
them, `ratio_cells` writes them as a fixed-width table under `RATIO_HEADER`),
and records `machine()`
next to its table; `write_config`, `write_json`, `write_csv` and `write_text`
write its files.
"""

import csv
import dataclasses
import json
import logging
import os
import platform
import statistics
import time

import keras
import tensorflow as tf

__all__ = [
    "RATIO_COLUMNS",
    "RATIO_HEADER",
    "Timed",
    "TimingConfig",
    "log_ratio_row",
    "machine",
    "optimizer",
    "paired_ratios",
    "ratio_cells",
    "ratio_row",
    "round_robin",
    "write_config",
    "write_csv",
    "write_json",
    "write_text",
]


class TimingConfig:
    """The settings every step-time benchmark's `Config` shares: how it times.

    A config dataclass (frozen or not) that subclasses it gets these fields,
    after its own, with the defaults it names as class keywords and
    `benchmarks.step_time`'s for the others; `steps=None` leaves out `steps`,
    for a benchmark whose rounds' steps follow from its other settings. The
    docstring below gives each its flag's help (`experiments.common.cli`).

        @dataclasses.dataclass(frozen=True)
        class Config(harness.TimingConfig, steps=50, warmup_steps=5):
            batch: int = 64  # its own fields, documented in its docstring

    Attributes:
      steps: Steps per timed round.
      steps_per_execution: Steps per train_function.
      warmup_steps: Untimed steps per contender.
      repeats: Rounds over all contenders.
      seed: Seed of the weights and the data.
    """

    def __init_subclass__(
        cls, steps=20, steps_per_execution=5, warmup_steps=10, repeats=5, seed=0
    ):
        super().__init_subclass__()
        defaults = dict(
            steps=steps,
            steps_per_execution=steps_per_execution,
            warmup_steps=warmup_steps,
            repeats=repeats,
            seed=seed,
        )
        # Declared on the subclass itself, before its dataclass decorator
        # reads its annotations: a dataclass base would have to match the
        # subclass's frozen or not, and each other default would be a field
        # declared again in every subclass.
        annotations = dict(cls.__dict__.get("__annotations__", {}))
        for name, default in defaults.items():
            if name in annotations:
                raise TypeError(
                    f"`{cls.__qualname__}` declares `{name}`, a field of"
                    f" TimingConfig: give its default as a class keyword,"
                    f" `{name}=...`, instead."
                )
            if default is not None:
                annotations[name] = int
                setattr(cls, name, default)
        cls.__annotations__ = annotations


class Timed:
    """One compiled model and an endless iterator over one fixed batch.

    `fit` builds the optimizer, the masker and the train function; the timed
    calls then reuse that function on a plain iterator, which needs one more
    trace, done here too, with `warmup_steps` untimed steps. A backend whose
    train function takes other arguments overrides `prepare` and `call`.
    """

    def __init__(self, key, model, x, y, steps, steps_per_execution, warmup_steps):
        self.key = key
        self.model = model
        self.iterator = self.prepare(x, y, steps_per_execution)
        self.calls = max(1, steps // steps_per_execution)
        self.steps = self.calls * steps_per_execution
        for _ in range(max(1, warmup_steps // steps_per_execution)):
            self.call()

    def prepare(self, x, y, steps_per_execution):
        """Fits `model` once on the batch; returns the iterator `call` reads."""
        dataset = tf.data.Dataset.from_tensors((x, y)).repeat()
        self.model.fit(
            dataset, steps_per_epoch=steps_per_execution, shuffle=False, verbose=0
        )
        return iter(dataset)

    def call(self):
        """Runs one call of the train function; returns its logs."""
        # Looked up per call, as fit does: a schedule may retrace it.
        return self.model.train_function(self.iterator)

    @classmethod
    def of_config(cls, key, model, x, y, config, steps=None):
        """The contender timed as `config` says: its `steps` (unless given),
        `steps_per_execution` and `warmup_steps`."""
        return cls(
            key,
            model,
            x,
            y,
            config.steps if steps is None else steps,
            config.steps_per_execution,
            config.warmup_steps,
        )

    def time_step(self):
        """Runs `steps` training steps; returns wall and CPU seconds per step."""
        start, start_cpu = time.perf_counter(), time.process_time()
        for _ in range(self.calls):
            logs = self.call()
        float(logs["loss"])
        wall = time.perf_counter() - start
        return wall / self.steps, (time.process_time() - start_cpu) / self.steps


def round_robin(contenders, repeats):
    """Times `contenders` in turn for `repeats` rounds; returns `(wall, cpu)` dicts.

    Each maps a contender's key to its seconds per step, one per round. The
    first call of each function after the others were built is slow (~80 ms
    on a tiny MLP against ~1 ms later): one untimed round absorbs it. The
    order rotates every round, so no contender always follows the same one.
    """
    for contender in contenders:
        contender.time_step()
    times = {c.key: [] for c in contenders}
    cpu_times = {c.key: [] for c in contenders}
    for repeat in range(repeats):
        shift = repeat % len(contenders)
        for contender in contenders[shift:] + contenders[:shift]:
            wall, cpu = contender.time_step()
            times[contender.key].append(wall)
            cpu_times[contender.key].append(cpu)
    return times, cpu_times


def paired_ratios(times, key, baseline):
    """Per-round ratios of `key`'s times to `baseline`'s: `(median, min, max)`."""
    ratios = [t / s for t, s in zip(times[key], times[baseline])]
    return statistics.median(ratios), min(ratios), max(ratios)


# The keys of a `ratio_row`, in its order (columns of the benchmarks' CSVs).
RATIO_COLUMNS = (
    "step_ms",
    "ratio_median",
    "ratio_min",
    "ratio_max",
    "cpu_ratio_median",
)
# The header of `ratio_cells`, for a fixed-width table.
RATIO_HEADER = f"{'ms/step':>8} {'ratio':>6} {'spread':>13} {'cpu ratio':>9}"


def ratio_row(times, cpu_times, key, baseline):
    """`key`'s median step time and its paired ratios to `baseline`'s, as a dict.

    The keys (`RATIO_COLUMNS`): `step_ms` (median milliseconds per step),
    `ratio_median`, `ratio_min`, `ratio_max` (of wall times, per round) and
    `cpu_ratio_median` (of the process's CPU times).
    """
    ratio, low, high = paired_ratios(times, key, baseline)
    return {
        "step_ms": 1e3 * statistics.median(times[key]),
        "ratio_median": ratio,
        "ratio_min": low,
        "ratio_max": high,
        "cpu_ratio_median": paired_ratios(cpu_times, key, baseline)[0],
    }


def ratio_cells(row):
    """A `ratio_row`'s values as fixed-width cells, under `RATIO_HEADER`;
    dashes for a row not timed (its values None)."""
    if row["step_ms"] is None:
        return f"{'-':>8} {'-':>6} {'-':>13} {'-':>9}"
    return (
        f"{row['step_ms']:8.2f} {row['ratio_median']:6.3f}"
        f" [{row['ratio_min']:.3f},{row['ratio_max']:.3f}]"
        f" {row['cpu_ratio_median']:9.3f}"
    )


def log_ratio_row(label, row, ratio="ratio", ms_digits=2):
    """Logs a `ratio_row`: `label: <ms> ms/step, <ratio> <median> [<min>, <max>]`."""
    logging.info(
        "%s: %.*f ms/step, %s %.3f [%.3f, %.3f]",
        label,
        ms_digits,
        row["step_ms"],
        ratio,
        row["ratio_median"],
        row["ratio_min"],
        row["ratio_max"],
    )


def optimizer(name):
    """A new `adamw` (1e-4, weight decay 0.004) or `sgd` (1e-3) optimizer."""
    if name == "adamw":
        return keras.optimizers.AdamW(learning_rate=1e-4, weight_decay=0.004)
    if name == "sgd":
        return keras.optimizers.SGD(learning_rate=1e-3)
    raise ValueError(f"Unknown optimizer {name!r}; expected 'adamw' or 'sgd'.")


def machine():
    """Describes where the benchmark ran: CPU, cores, GPUs, library versions."""
    model_name = platform.processor()
    try:
        with open("/proc/cpuinfo") as f:
            names = [line for line in f if line.startswith("model name")]
        model_name = names[0].split(":", 1)[1].strip() if names else model_name
    except OSError:
        pass
    return {
        "cpu": model_name,
        "cores": os.cpu_count(),
        "gpus": len(tf.config.list_physical_devices("GPU")),
        "tensorflow": tf.__version__,
        "keras": keras.__version__,
    }


def write_config(workdir, config):
    """Makes `workdir` and writes the dataclass `config` there as `config.json`."""
    os.makedirs(workdir, exist_ok=True)
    write_json(workdir, "config.json", dataclasses.asdict(config))


def write_json(workdir, name, value):
    """Writes `value` as indented JSON to the file `name` under `workdir`."""
    with open(os.path.join(workdir, name), "w") as f:
        json.dump(value, f, indent=2)


def write_text(workdir, name, text):
    """Writes `text` (a table) to the file `name` under `workdir`."""
    with open(os.path.join(workdir, name), "w") as f:
        f.write(text)


def write_csv(workdir, name, rows, columns):
    """Writes the dicts `rows` as CSV with the header `columns`."""
    with open(os.path.join(workdir, name), "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns)
        writer.writeheader()
        writer.writerows(rows)
