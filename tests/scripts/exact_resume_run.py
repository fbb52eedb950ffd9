"""Training runs that test_exact_resume.py kills and restarts.

    python exact_resume_run.py reference WORKDIR [mirrored]
    python exact_resume_run.py resume WORKDIR [mirrored]

`reference` trains every case of `CASES` (or `MIRRORED_CASES`) with plain
`fit`, no backup callback, and saves each one's final state to
WORKDIR/<case>.reference.npz. `resume` trains them in order with
`maskfit.ExactBackupAndRestore`; a case whose WORKDIR/<case>.resumed.npz exists
is done. The process kills itself with SIGKILL after the optimizer steps a case
lists in `kills` (each once: WORKDIR/<case>.killed records them) and while
writing the backups of the steps in `write_kills`; the test restarts it until
it exits with 0. It prints one `trained <case> <first step> <last step>` line
per fit, for the test to check where each restart resumed.
"""

import json
import os
import signal
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import maskfit  # noqa: E402
from maskfit import distribute  # noqa: E402
from maskfit import model as model_lib  # noqa: E402
from maskfit import pruning  # noqa: E402
from maskfit.backup import state as backup_state  # noqa: E402

SAMPLES, BATCH, EPOCHS = 40, 4, 3  # 10 steps an epoch, 30 in all
SAVE_FREQ = 4  # backups after steps 4, 8, 12, ... of a run
BOUNDARY = 15  # the PiecewiseMask switches here
# Prunes in steps 5, 10, 15, 20 and 25.
PRUNING = dict(initial_sparsity=0.0, final_sparsity=0.6, begin_step=5, end_step=25, frequency=5)

# name: model, input, shuffled, execution mode, steps_per_execution, kills.
CASES = {
    # Killed inside epoch 1 (resumes from step 12), then while writing the
    # backup of step 24 (resumes from step 20, the boundary and two pruning
    # steps crossed in between).
    "functional_arrays_shuffled_graph": dict(
        model="functional", input="arrays", shuffle=True, mode="graph", kills=[13],
        write_kills=[24],
    ),
    # Killed after the last step of epoch 1, just backed up: the resumed run
    # skips the whole epoch and goes on with epoch 2.
    "functional_tfdata_shuffled_jit": dict(
        model="functional", input="tfdata", shuffle=True, mode="jit", kills=[20]
    ),
    # Killed after the last step of epoch 0, backed up at step 8: the resumed
    # run skips 8 batches and trains the last 2 of the epoch.
    "functional_arrays_jit": dict(
        model="functional", input="arrays", shuffle=False, mode="jit", kills=[10]
    ),
    # Two steps per call; killed inside epoch 1 (resumes from step 12).
    "sequential_tfdata_spe2_graph": dict(
        model="sequential", input="tfdata", shuffle=False, mode="graph", spe=2, kills=[14]
    ),
    # A subclassed model that Keras builds inside fit, fed by a PyDataset that
    # fit shuffles: the restarted run must build it before loading the backup.
    "subclassed_pydataset_shuffled_graph": dict(
        model="subclassed", input="pydataset", shuffle=True, mode="graph", kills=[7]
    ),
}
MIRRORED_CASES = {
    "mirrored_functional_arrays_shuffled": dict(
        model="functional", input="arrays", shuffle=True, mode="graph", kills=[13]
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
            [maskfit.OutputMask([1, 1, 0, 1, 0, 1, 1, 1]), maskfit.OutputMask([0, 1, 1, 1, 1, 0, 1, 1])],
        ),
    )
    pruning.prune_low_magnitude(model, pruning_schedule=pruning.PolynomialDecay(**PRUNING))
    learning_rate = keras.optimizers.schedules.ExponentialDecay(0.02, 5, 0.8)
    model.compile(
        optimizer=keras.optimizers.AdamW(learning_rate, weight_decay=0.05),
        loss="mse",
        metrics=["mae"],
        jit_compile=case["mode"] == "jit",
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
    optimizer = model.optimizer
    keeps = model_lib.keep_masks(model)
    arrays = {f"weight_{i}": w.numpy() for i, w in enumerate(model.weights)}
    arrays.update({f"optimizer_{i}": v.numpy() for i, v in enumerate(optimizer.variables)})
    arrays.update({f"keep_{i}": keeps[i] for i in sorted(keeps)})
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


class Steps(keras.callbacks.Callback):
    def on_train_begin(self, logs=None):
        self.first = None

    def on_train_batch_begin(self, batch, logs=None):
        if self.first is None:
            self.first = int(self.model.optimizer.iterations.numpy())


def run_case(name, case, phase, workdir, suffix):
    model = build(case)
    steps = Steps()
    callbacks = [steps]
    if phase == "resume":
        record = os.path.join(workdir, f"{name}.killed")
        real_write = backup_state._write_progress

        def write_progress(path, progress):
            # Dies with the weights and arrays written, the progress not yet:
            # the backup folder is still a partial one.
            label = f"write {progress['optimizer_step']}"
            kill_once(record, label, progress["optimizer_step"] in case.get("write_kills", ()))
            real_write(path, progress)

        backup_state._write_progress = write_progress
        backup = maskfit.ExactBackupAndRestore(
            os.path.join(workdir, f"{name}.backup"), save_freq=SAVE_FREQ
        )
        callbacks = [steps, backup, Killer(record, case.get("kills", ()))]
    history = model.fit(**data(case), epochs=EPOCHS, verbose=0, callbacks=callbacks)
    step = int(model.optimizer.iterations.numpy())
    print(f"trained {name} {steps.first} {step}", flush=True)
    arrays = final_state(model)
    logs = {key: values[-1] for key, values in history.history.items()}
    arrays["logs"] = np.asarray(json.dumps(logs))
    np.savez(os.path.join(workdir, f"{name}.{suffix}.npz"), **arrays)


def main(phase, workdir, strategy_name="default"):
    strategy = distribute.make_strategy(
        strategy_name, logical_devices=2 if strategy_name == "mirrored" else None
    )
    cases = MIRRORED_CASES if strategy_name == "mirrored" else CASES
    suffix = "reference" if phase == "reference" else "resumed"
    for name, case in cases.items():
        if os.path.exists(os.path.join(workdir, f"{name}.{suffix}.npz")):
            continue
        keras.backend.clear_session(free_memory=False)
        keras.utils.set_random_seed(11)
        with strategy.scope():
            run_case(name, case, phase, workdir, suffix)


if __name__ == "__main__":
    main(*sys.argv[1:])
