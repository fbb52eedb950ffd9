"""Training runs that test_exact_resume.py kills and restarts.

    python exact_resume_run.py PHASE WORKDIR [mirrored]

PHASE `reference` trains every case of `CASES` (or `MIRRORED_CASES`) with
plain `fit`, no backup callback, and saves each one's final state to
WORKDIR/<case>.reference.npz; `resume+reference` does `resume`, then that (one
process fewer to start). `resume` trains them in order with
`maskfit.ExactBackupAndRestore`; a case whose WORKDIR/<case>.resumed.npz exists
is done. The process kills itself with SIGKILL after the optimizer steps a case
lists in `kills` (each once: WORKDIR/<case>.killed records them) and while
writing the backups of the steps in `write_kills`; the test restarts it until
it exits with 0. Before each fit with a backup to resume, it prints
`resuming <case> from <optimizer step> <what the backup folder holds>`.

Under KERAS_BACKEND=jax the cases are `JAX_CASES` (eager and jitted; no
tf.distribute strategy there); test_exact_resume.py runs them too.
"""

import contextlib
import json
import os
import signal
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import maskfit  # noqa: E402
from maskfit import (
    distribute,  # noqa: E402
    pruning,  # noqa: E402
)
from maskfit import model as model_lib  # noqa: E402
from maskfit.backup import files as backup_files  # noqa: E402
from maskfit.backup import state as backup_state  # noqa: E402
from maskfit.optim import traits  # noqa: E402

SAMPLES, BATCH, EPOCHS = 40, 4, 3  # 10 steps an epoch, 30 in all
SAVE_FREQ = 4  # backups after steps 4, 8, 12, ... of a run
BOUNDARY = 15  # the PiecewiseMask switches here
# Prunes in steps 5, 10, 15, 20 and 25.
PRUNING = dict(
    initial_sparsity=0.0, final_sparsity=0.6, begin_step=5, end_step=25, frequency=5
)


# Each case: the model, its input, whether fit or the dataset shuffles, the
# execution mode, the steps after which the process is killed and the steps
# the restarts resume from (for the test); optionally `spe`
# (steps_per_execution) and `write_kills`, the steps whose backup write is
# killed.
def _case(model, input, shuffle, mode, kills, resumes, **more):
    return dict(
        model=model,
        input=input,
        shuffle=shuffle,
        mode=mode,
        kills=kills,
        resumes=resumes,
        **more,
    )


CASES = {
    # Killed inside epoch 1 (resumes from step 12), then while writing the
    # backup of step 24 (resumes from step 20; the mask's boundary and two
    # pruning steps lie in between).
    "functional_arrays_shuffled_graph": _case(
        "functional", "arrays", True, "graph", [13], [12, 20], write_kills=[24]
    ),
    # Killed after the last step of epoch 1, just backed up: the resumed run
    # skips the whole epoch and goes on with epoch 2.
    "functional_tfdata_shuffled_jit": _case(
        "functional", "tfdata", True, "jit", [20], [20]
    ),
    # Two steps per call; killed after the last step of epoch 0, backed up
    # at step 8: the resumed run skips 4 calls and trains steps 9 and 10.
    "sequential_arrays_spe2_jit": _case(
        "sequential", "arrays", False, "jit", [10], [8], spe=2
    ),
    # A subclassed model that Keras builds inside fit, fed by a PyDataset that
    # fit shuffles: the restarted run builds it before loading the backup.
    "subclassed_pydataset_shuffled_graph": _case(
        "subclassed", "pydataset", True, "graph", [7], [4]
    ),
}
# Under JAX: eager ("eager": run_eagerly=True) and jitted steps. The JAX step
# prunes between compiled calls, so the case with two steps per call trains
# without pruning (`prune=False`).
JAX_CASES = {
    "jax_functional_arrays_shuffled_eager": _case(
        "functional", "arrays", True, "eager", [13], [12, 20], write_kills=[24]
    ),
    "jax_functional_tfdata_shuffled_jit": _case(
        "functional", "tfdata", True, "jit", [20], [20]
    ),
    "jax_sequential_arrays_spe2_jit": _case(
        "sequential", "arrays", False, "jit", [10], [8], spe=2, prune=False
    ),
    "jax_subclassed_pydataset_shuffled_jit": _case(
        "subclassed", "pydataset", True, "jit", [7], [4]
    ),
}
ON_JAX = keras.backend.backend() == "jax"
if ON_JAX:
    CASES = JAX_CASES
MIRRORED_CASES = {
    "mirrored_functional_arrays_shuffled": _case(
        "functional", "arrays", True, "graph", [13], [12]
    ),
}


class Subclassed(maskfit.MaskedModel):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.body = keras.layers.Dense(8, activation="tanh", name="body")
        self.drop = keras.layers.Dropout(0.25, name="drop")
        self.mid = keras.layers.Dense(8, activation="relu", name="mid")
        self.head = keras.layers.Dense(3, name="head")

    def call(self, x, training=False):
        return self.head(self.mid(self.drop(self.body(x), training=training)))


class Batches(keras.utils.PyDataset):
    def __init__(self, x, y):
        super().__init__()
        self.x, self.y = x, y

    def __len__(self):
        return SAMPLES // BATCH

    def __getitem__(self, index):
        part = slice(index * BATCH, (index + 1) * BATCH)
        return self.x[part], self.y[part]


def layers():
    return [
        keras.layers.Dense(8, activation="tanh", name="body"),
        keras.layers.Dropout(0.25, name="drop"),
        keras.layers.Dense(8, activation="relu", name="mid"),
        keras.layers.Dense(3, name="head"),
    ]


def build(case):
    kind = case["model"]
    if kind == "functional":
        inputs = keras.Input((6,))
        outputs = inputs
        for layer in layers():
            outputs = layer(outputs)
        model = maskfit.MaskedModel(inputs, outputs)
    elif kind == "sequential":
        model = maskfit.MaskedSequential([keras.Input((6,))] + layers())
    else:
        model = Subclassed()
    body, head = model.get_layer("body"), model.get_layer("head")
    maskfit.set_mask(head, maskfit.OutputMask([1, 0, 1]))
    maskfit.set_mask(
        body,
        maskfit.PiecewiseMask(
            [BOUNDARY],
            [
                maskfit.OutputMask([1, 1, 0, 1, 0, 1, 1, 1]),
                maskfit.OutputMask([0, 1, 1, 1, 1, 0, 1, 1]),
            ],
        ),
    )
    if case.get("prune", True):
        pruning.prune_low_magnitude(
            model, pruning_schedule=pruning.PolynomialDecay(**PRUNING)
        )
    learning_rate = keras.optimizers.schedules.ExponentialDecay(0.02, 5, 0.8)
    model.compile(
        optimizer=keras.optimizers.AdamW(learning_rate, weight_decay=0.05),
        loss="mse",
        metrics=["mae"],
        jit_compile=case["mode"] == "jit",
        run_eagerly=case["mode"] == "eager",
        steps_per_execution=case.get("spe", 1),
    )
    return model


def data(case):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(SAMPLES, 6)).astype("float32")
    y = rng.normal(size=(SAMPLES, 3)).astype("float32")
    if case["input"] == "arrays":
        return dict(x=x, y=y, batch_size=BATCH, shuffle=case["shuffle"])
    if case["input"] == "pydataset":
        return dict(x=Batches(x, y), shuffle=case["shuffle"])
    dataset = tf.data.Dataset.from_tensor_slices((x, y))
    if case["shuffle"]:
        dataset = dataset.shuffle(SAMPLES, seed=5, reshuffle_each_iteration=False)
    return dict(x=dataset.batch(BATCH), shuffle=False)


def final_state(model):
    """Weights, optimizer variables and keep masks; `slot_keep_<j>`: the keep
    mask that optimizer variable j's entries follow."""
    optimizer = model.optimizer
    keeps = model_lib.keep_masks(model)
    arrays = {f"weight_{i}": w.numpy() for i, w in enumerate(model.weights)}
    arrays.update({f"keep_{i}": keeps[i] for i in sorted(keeps)})
    slots = list(optimizer.variables)
    arrays.update({f"optimizer_{j}": v.numpy() for j, v in enumerate(slots)})
    variables = model_lib.all_trainable_variables(model)
    for i in keeps:
        for slot in traits.state_of(optimizer, variables[i]):
            j = next(j for j, v in enumerate(slots) if v is slot)
            arrays[f"slot_keep_{j}"] = np.asarray(i)
    return arrays


class Killer(keras.callbacks.Callback):
    """SIGKILLs this process after the listed optimizer steps, each once."""

    def __init__(self, record, steps):
        super().__init__()
        self.record, self.steps = record, steps

    def on_train_batch_end(self, batch, logs=None):
        step = int(self.model.optimizer.iterations.numpy())
        kill_once(self.record, f"step {step}", step in self.steps)


def kill_once(record, label, due):
    """Kills the process the first time `label` is due (recorded in `record`)."""
    done = open(record).read().split("\n") if os.path.exists(record) else []
    if not due or label in done:
        return
    with open(record, "a") as f:
        f.write(label + "\n")
        f.flush()
        os.fsync(f.fileno())
    print(f"killed {label}", flush=True)
    os.kill(os.getpid(), signal.SIGKILL)


def report_backup(name, folder):
    found = backup_files.complete(folder)
    if found:
        with open(os.path.join(found[0], backup_state.PROGRESS)) as f:
            step = json.load(f)["optimizer_step"]
        print(f"resuming {name} from {step} {sorted(os.listdir(folder))}", flush=True)


def run_case(name, case, phase, workdir, suffix):
    model = build(case)
    callbacks = []
    if phase == "resume":
        record = os.path.join(workdir, f"{name}.killed")
        real_write = backup_state._write_progress

        def write_progress(path, progress):
            # Dies with the weights and arrays written, the progress not yet:
            # the backup folder is still a partial one.
            label = f"write {progress['optimizer_step']}"
            due = progress["optimizer_step"] in case.get("write_kills", ())
            kill_once(record, label, due)
            real_write(path, progress)

        backup_state._write_progress = write_progress
        folder = os.path.join(workdir, f"{name}.backup")
        report_backup(name, folder)
        backup = maskfit.ExactBackupAndRestore(folder, save_freq=SAVE_FREQ)
        callbacks = [backup, Killer(record, case.get("kills", ()))]
    history = model.fit(**data(case), epochs=EPOCHS, verbose=0, callbacks=callbacks)
    arrays = final_state(model)
    logs = {key: values[-1] for key, values in history.history.items()}
    arrays["logs"] = np.asarray(json.dumps(logs))
    np.savez(os.path.join(workdir, f"{name}.{suffix}.npz"), **arrays)


def main(phase, workdir, strategy_name="default"):
    if ON_JAX:  # one device, no tf.distribute strategy
        scope = contextlib.nullcontext
    else:
        strategy = distribute.make_strategy(
            strategy_name, logical_devices=2 if strategy_name == "mirrored" else None
        )
        scope = strategy.scope
    cases = MIRRORED_CASES if strategy_name == "mirrored" else CASES
    for each in phase.split("+"):
        suffix = "reference" if each == "reference" else "resumed"
        for name, case in cases.items():
            if os.path.exists(os.path.join(workdir, f"{name}.{suffix}.npz")):
                continue
            keras.backend.clear_session(free_memory=False)
            keras.utils.set_random_seed(11)
            with scope():
                run_case(name, case, each, workdir, suffix)


if __name__ == "__main__":
    main(*sys.argv[1:])
