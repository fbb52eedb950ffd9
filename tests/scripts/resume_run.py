"""A training run that the resume tests interrupt: python resume_run.py PHASE WORKDIR [MODEL].

PHASE is one of:
  full      train without interruption;
  hang      train with BackupAndRestore and stop at STOP_STEP, waiting to be killed;
  raise     train with BackupAndRestore, raise at STOP_STEP, then fit again;
  resume    train with BackupAndRestore (after `hang` was killed).
MODEL is `masks` (default: scheduled masks) or `pruning` (magnitude pruning
that composes with a mask). Every phase that finishes writes
WORKDIR/weights_PHASE.npz (for `pruning`, the keep masks after the weights)
and the initial weights.
"""

import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import maskfit  # noqa: E402
from maskfit import model as model_lib  # noqa: E402
from maskfit import pruning  # noqa: E402

STOP_STEP = 9  # mid-epoch: epochs have 4 steps
EPOCHS = 4


class StopAt(keras.callbacks.Callback):
    def __init__(self, marker, hang):
        super().__init__()
        self.marker, self.hang, self.step = marker, hang, 0

    def on_train_batch_end(self, batch, logs=None):
        self.step += 1
        if self.step == STOP_STEP:
            if self.hang:
                with open(self.marker, "w") as f:
                    f.write("waiting")
                time.sleep(600)
            raise RuntimeError("interrupted on purpose")


class StepCounter(keras.callbacks.Callback):
    steps = 0

    def on_train_batch_end(self, batch, logs=None):
        self.steps += 1


def build():
    keras.utils.set_random_seed(11)
    inputs = keras.Input((3,))
    body = keras.layers.Dense(5, activation="tanh", name="body")
    head = keras.layers.Dense(2, name="head")
    tail = keras.layers.Dense(2, name="tail")
    model = maskfit.MaskedModel(inputs, tail(head(body(inputs))))
    # Fully frozen (no optimizer slots) until step 6, so the backups of
    # epochs 2 and 3 hold an optimizer built for more variables than a fresh
    # program plans at step 0.
    maskfit.set_mask(
        tail,
        maskfit.PiecewiseMask(
            [6], [maskfit.OutputMask([0, 0]), maskfit.OutputMask([1, 1])]
        ),
    )
    maskfit.set_mask(head, maskfit.OutputMask([1, 0]))
    maskfit.set_mask(
        body,
        maskfit.PiecewiseMask(
            [6],
            [maskfit.OutputMask([1, 1, 0, 0, 1]), maskfit.OutputMask([0, 1, 1, 0, 1])],
        ),
    )
    model.compile(optimizer=keras.optimizers.AdamW(0.02, weight_decay=0.05), loss="mse")
    return model


def build_pruned():
    keras.utils.set_random_seed(11)
    inputs = keras.Input((3,))
    body = keras.layers.Dense(8, activation="tanh", name="body")
    head = keras.layers.Dense(2, name="head")
    model = maskfit.MaskedModel(inputs, head(body(inputs)))
    maskfit.set_mask(head, maskfit.OutputMask([1, 0]))
    # Prunes in steps 7 and 14: the backup of step 8 holds keep masks that
    # steps 9-13 need (they do not prune), and the resumed runs prune again.
    pruning.prune_low_magnitude(
        model, pruning_schedule=pruning.PolynomialDecay(0.0, 0.75, 0, 14, frequency=7)
    )
    model.compile(optimizer=keras.optimizers.AdamW(0.02, weight_decay=0.05), loss="mse")
    return model


BUILDERS = {"masks": build, "pruning": build_pruned}


def state(model):
    """The weights, then (for pruned models) the keep masks by variable position."""
    keeps = model_lib.keep_masks(model)
    return [w.numpy() for w in model.weights] + [keeps[i] for i in sorted(keeps)]


def main(phase, workdir, variant="masks"):
    tf.config.experimental.enable_op_determinism()
    rng = np.random.default_rng(0)
    x = rng.normal(size=(16, 3)).astype("float32")
    y = rng.normal(size=(16, 2)).astype("float32")
    build_model = BUILDERS[variant]
    model = build_model()
    np.savez(os.path.join(workdir, "initial.npz"), *[w.numpy() for w in model.weights])

    def fit(extra=()):
        callbacks = (
            []
            if phase == "full"
            else [keras.callbacks.BackupAndRestore(os.path.join(workdir, "backup"))]
        )
        model.fit(
            x,
            y,
            batch_size=4,
            epochs=EPOCHS,
            shuffle=False,
            verbose=0,
            callbacks=callbacks + list(extra),
        )

    marker = os.path.join(workdir, "waiting")
    if phase in ("hang", "raise"):
        try:
            fit([StopAt(marker, hang=phase == "hang")])
        except RuntimeError:
            pass
        model = build_model()  # as a restarted program would
    counter = StepCounter()
    fit([counter])
    with open(os.path.join(workdir, f"steps_{phase}.txt"), "w") as f:
        f.write(str(counter.steps))
    np.savez(os.path.join(workdir, f"weights_{phase}.npz"), *state(model))


if __name__ == "__main__":
    main(*sys.argv[1:])
