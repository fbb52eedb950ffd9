"""Killed runs resumed by Keras's BackupAndRestore and by maskfit's (issue 27).

A masked, pruned model (two `OutputMask`s, one of them a `PiecewiseMask`,
`prune_low_magnitude` with `PolynomialDecay`, dropout, AdamW with weight decay
and a learning-rate schedule) trains on shuffled arrays with a global seed.
For each contender (a backup callback and its `save_freq`) and each of
`kills` steps drawn at random, a child process trains until that step and
SIGKILLs itself; a second one resumes with the same callback and finishes.
Its final weights and optimizer variables are compared with those of one
uninterrupted run: how many resumed runs end bit-identical, how far the
others are, and how many steps each trained (a batch trained twice shows).

Contenders: `keras_steps` (`keras.callbacks.BackupAndRestore(save_freq=N)`),
`maskfit_steps` (`maskfit.ExactBackupAndRestore(save_freq=N)`), and both
with `save_freq="epoch"` (`keras_epoch`, `maskfit_epoch`).

`step_overhead` times `fit` with each callback and no backup due against plain
`fit` (the callbacks' own cost per step), in turns, and reports the median of
the paired ratios.
"""

import concurrent.futures
import dataclasses
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time

import keras
import numpy as np

import maskfit
from benchmarks import harness
from maskfit import pruning

CONTENDERS = ("keras_steps", "maskfit_steps", "keras_epoch", "maskfit_epoch")


@dataclasses.dataclass(frozen=True)
class Config:
    """What to measure; the defaults are issue 27's.

    Attributes:
      kills: Kill steps (random) per contender.
      save_freq: Steps between backups (*_steps).
      samples: Training examples.
      batch: Batch size.
      epochs: Epochs of 16 steps.
      jit_compile: Compile the steps with XLA.
      contenders: Which to measure.
      processes: Child processes at a time.
      overhead_steps: Steps of each timed run (the backups' overhead).
      overhead_repeats: Timed runs per contender (the backups' overhead).
      seed: Seed of the model, the data and the kill steps.
    """

    kills: int = 8
    save_freq: int = 7
    samples: int = 64
    batch: int = 4
    epochs: int = 4
    jit_compile: bool = False
    contenders: tuple = CONTENDERS
    processes: int = 2
    overhead_steps: int = 1024
    overhead_repeats: int = 5
    seed: int = 0

    def __post_init__(self):
        unknown = sorted(set(self.contenders) - set(CONTENDERS))
        if unknown:
            raise ValueError(
                f"Unknown contenders {unknown}; expected some of {CONTENDERS}."
            )
        for name in (
            "kills",
            "save_freq",
            "samples",
            "batch",
            "epochs",
            "processes",
            "overhead_steps",
            "overhead_repeats",
        ):
            if getattr(self, name) < 1:
                value = getattr(self, name)
                raise ValueError(
                    f"`{name}` must be at least 1. Received: {name}={value}"
                )

    @property
    def steps(self):
        return -(-self.samples // self.batch) * self.epochs


def kill_steps(config):
    """The steps after which the killed runs die, the same for every contender."""
    rng = np.random.default_rng(config.seed)
    count = min(config.kills, config.steps - 1)
    drawn = rng.choice(np.arange(1, config.steps), count, replace=False)
    return sorted(int(step) for step in drawn)


def build(config):
    """Returns `(model, x, y)`, compiled; the same for every run."""
    keras.utils.set_random_seed(config.seed)
    inputs = keras.Input((6,))
    body = keras.layers.Dense(16, activation="tanh", name="body")
    head = keras.layers.Dense(3, name="head")
    outputs = head(keras.layers.Dropout(0.2)(body(inputs)))
    model = maskfit.MaskedModel(inputs, outputs)
    maskfit.set_mask(head, maskfit.OutputMask([1, 0, 1]))
    half = config.steps // 2
    maskfit.set_mask(
        body,
        maskfit.PiecewiseMask(
            [half], [maskfit.OutputMask([1, 0] * 8), maskfit.OutputMask([0, 1] * 8)]
        ),
    )
    begin = min(3, config.steps // 4)
    schedule = pruning.PolynomialDecay(
        0.0,
        0.5,
        begin_step=begin,
        end_step=max(begin + 1, config.steps - 3),
        frequency=5,
    )
    pruning.prune_low_magnitude(model, pruning_schedule=schedule)
    learning_rate = keras.optimizers.schedules.ExponentialDecay(0.02, 10, 0.8)
    model.compile(
        optimizer=keras.optimizers.AdamW(learning_rate, weight_decay=0.05),
        loss="mse",
        jit_compile=config.jit_compile,
    )
    rng = np.random.default_rng(config.seed + 1)
    x = rng.normal(size=(config.samples, 6)).astype("float32")
    y = rng.normal(size=(config.samples, 3)).astype("float32")
    return model, x, y


def _callback(config, contender, folder):
    cls = (
        keras.callbacks.BackupAndRestore
        if contender.startswith("keras")
        else maskfit.ExactBackupAndRestore
    )
    save_freq = config.save_freq if contender.endswith("steps") else "epoch"
    return cls(folder, save_freq=save_freq)


class _Killer(keras.callbacks.Callback):
    def __init__(self, step, marker):
        super().__init__()
        self.step, self.marker = step, marker

    def on_train_batch_end(self, batch, logs=None):
        step = int(self.model.optimizer.iterations.numpy())
        if step == self.step and not os.path.exists(self.marker):
            open(self.marker, "w").close()
            os.kill(os.getpid(), signal.SIGKILL)


def child(config, contender, kill_step, folder):
    """One run of a child process; writes folder/final.npz when it ends.

    `contender` "reference" trains without a callback; otherwise the run dies
    after `kill_step` unless folder/killed exists.
    """
    model, x, y = build(config)
    callbacks = []
    if contender != "reference":
        callbacks = [
            _callback(config, contender, os.path.join(folder, "backup")),
            _Killer(kill_step, os.path.join(folder, "killed")),
        ]
    model.fit(
        x,
        y,
        batch_size=config.batch,
        epochs=config.epochs,
        shuffle=True,
        verbose=0,
        callbacks=callbacks,
    )
    arrays = {f"weight_{i}": v.numpy() for i, v in enumerate(model.weights)}
    arrays.update(
        {f"optimizer_{i}": v.numpy() for i, v in enumerate(model.optimizer.variables)}
    )
    arrays["iterations"] = model.optimizer.iterations.numpy()
    np.savez(os.path.join(folder, "final.npz"), **arrays)


def _run_child(config, contender, kill_step, folder):
    """Runs the child until it ends (a killed one is started once more)."""
    os.makedirs(folder, exist_ok=True)
    command = [
        sys.executable,
        "-m",
        "benchmarks.resume_exactness",
        f"--child={contender}",
        f"--kill_step={kill_step}",
        f"--workdir={folder}",
        f"--config_json={json.dumps(dataclasses.asdict(config))}",
    ]
    for _ in range(2):
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode == 0:
            return
        if done.returncode != -signal.SIGKILL:
            raise RuntimeError(
                f"{contender} (kill at {kill_step}) failed:\n{done.stderr[-3000:]}"
            )
    raise RuntimeError(f"{contender} (kill at {kill_step}) was killed twice")


def _load(folder):
    with np.load(os.path.join(folder, "final.npz")) as arrays:
        return {key: arrays[key] for key in arrays.files}


def compare(reference, resumed):
    """Returns `(bit-identical, max |difference| of the weights, steps trained)`."""
    exact = all(np.array_equal(reference[k], resumed[k]) for k in reference)
    distance = max(
        float(np.max(np.abs(reference[k] - resumed[k])))
        for k in reference
        if k.startswith("weight_")
    )
    return exact, distance, int(resumed["iterations"])


def run(config, workdir):
    """Measures every contender; writes resume_exactness.json and .md; returns the rows."""
    os.makedirs(workdir, exist_ok=True)
    steps = kill_steps(config)
    jobs = [("reference", 0, os.path.join(workdir, "reference"))]
    jobs += [
        (c, s, os.path.join(workdir, f"{c}_{s}"))
        for c in config.contenders
        for s in steps
    ]
    with concurrent.futures.ThreadPoolExecutor(config.processes) as pool:
        for future in [pool.submit(_run_child, config, *job) for job in jobs]:
            future.result()
    reference = _load(jobs[0][2])
    rows = []
    for contender in config.contenders:
        runs = []
        for step in steps:
            resumed = _load(os.path.join(workdir, f"{contender}_{step}"))
            exact, distance, trained = compare(reference, resumed)
            runs.append(
                dict(
                    kill_step=step,
                    exact=exact,
                    max_abs_difference=distance,
                    steps_trained=trained,
                )
            )
        rows.append(
            dict(
                contender=contender,
                exact=sum(r["exact"] for r in runs),
                kills=len(runs),
                median_max_abs_difference=statistics.median(
                    r["max_abs_difference"] for r in runs
                ),
                runs=runs,
            )
        )
    overhead = step_overhead(config)
    result = dict(
        config=dataclasses.asdict(config),
        kill_steps=steps,
        rows=rows,
        overhead=overhead,
    )
    harness.write_json(workdir, "resume_exactness.json", result)
    harness.write_text(
        workdir, "resume_exactness.md", format_table(rows, config, overhead) + "\n"
    )
    return rows, overhead


def step_overhead(config):
    """Returns `{callback: median of paired per-step time ratios over plain fit}`.

    One model; each round fits one epoch of `overhead_steps` steps with no
    callback, with Keras's and with maskfit's (`save_freq` never reached), in
    an order that rotates; a first round warms every contender up.
    """
    model, x, y = build(config)
    count = config.overhead_steps * config.batch
    x, y = np.resize(x, (count, x.shape[1])), np.resize(y, (count, y.shape[1]))
    folder = tempfile.mkdtemp()
    classes = {
        "none": None,
        "keras": keras.callbacks.BackupAndRestore,
        "maskfit": maskfit.ExactBackupAndRestore,
    }

    def seconds_per_step(name):
        callbacks = []
        if classes[name] is not None:
            callbacks = [classes[name](os.path.join(folder, name), save_freq=10**9)]
        start = time.perf_counter()
        model.fit(
            x,
            y,
            batch_size=config.batch,
            epochs=1,
            shuffle=False,
            verbose=0,
            callbacks=callbacks,
        )
        return (time.perf_counter() - start) / config.overhead_steps

    names = list(classes)
    for name in names:
        seconds_per_step(name)
    times = {name: [] for name in names}
    for repeat in range(config.overhead_repeats):
        shift = repeat % len(names)
        for name in names[shift:] + names[:shift]:
            times[name].append(seconds_per_step(name))
    return {
        "ms_per_step_none": 1000 * statistics.median(times["none"]),
        **{
            name: statistics.median(t / s for t, s in zip(times[name], times["none"]))
            for name in ("keras", "maskfit")
        },
    }


def format_table(rows, config, overhead=None):
    lines = [
        f"| contender | bit-identical | median max abs weight difference | steps trained"
        f" (uninterrupted: {config.steps}) |",
        "| --- | --- | --- | --- |",
    ]
    for row in rows:
        trained = sorted({r["steps_trained"] for r in row["runs"]})
        lines.append(
            f"| {row['contender']} | {row['exact']} of {row['kills']} |"
            f" {row['median_max_abs_difference']:.3g} | {', '.join(map(str, trained))} |"
        )
    if overhead:
        lines.append("")
        lines.append(
            f"Per-step time of fit with the callback over plain fit (no backup due;"
            f" plain fit {overhead['ms_per_step_none']:.2f} ms/step): Keras's"
            f" {overhead['keras']:.3f}, maskfit's {overhead['maskfit']:.3f}."
        )
    return "\n".join(lines)
