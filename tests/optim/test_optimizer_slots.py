"""Rebuilding an optimizer for another variable set keeps the state of the variables it keeps."""

import re

import keras
import numpy as np
import pytest
import tensorflow as tf

from maskfit.optim import rebuild
from tests.helpers.keras_versions import param_if_shipped

OPTIMIZERS = {
    "Adam": lambda: keras.optimizers.Adam(0.1),
    "AdamW_ema": lambda: keras.optimizers.AdamW(0.1, use_ema=True, ema_momentum=0.5),
    "SGD_momentum": lambda: keras.optimizers.SGD(0.1, momentum=0.9),
    "Adagrad": lambda: keras.optimizers.Adagrad(0.1),
    "Adafactor": lambda: keras.optimizers.Adafactor(0.1),
    "Ftrl": lambda: keras.optimizers.Ftrl(0.1),
    "Muon": lambda: keras.optimizers.Muon(0.1),
    "Nadam": lambda: keras.optimizers.Nadam(0.1),
    "ScheduleFreeAdamW": lambda: keras.optimizers.ScheduleFreeAdamW(0.1),
    "accumulation": lambda: keras.optimizers.Adam(0.1, gradient_accumulation_steps=2),
    "LossScale": lambda: keras.optimizers.LossScaleOptimizer(
        keras.optimizers.Adam(0.1)
    ),
}
# The keras.optimizers class of the OPTIMIZERS not named after theirs.
CLASSES = {"accumulation": "Adam", "LossScale": "LossScaleOptimizer"}


def variables():
    rng = np.random.default_rng(0)
    return (
        keras.Variable(rng.normal(size=(3, 4)).astype("float32"), name="a"),
        keras.Variable(rng.normal(size=(4,)).astype("float32"), name="b"),
        keras.Variable(rng.normal(size=(2, 2)).astype("float32"), name="c"),
    )


def train(optimizer, trained, steps=3):
    for step in range(steps):
        grads = [tf.fill(v.shape, 0.1 * (step + 1)) for v in trained]
        optimizer.apply(grads, list(trained))


def state(optimizer):
    """`{path: [values]}`: some optimizers (Adafactor) give two slots one path.

    Unnamed variables (Nadam's momentum product) get a new numbered name
    ("variable_1") each time they are made; they are keyed as "variable".
    """
    found = {}
    for v in optimizer.variables:
        path = re.sub(r"^variable(_\d+)?$", "variable", v.path)
        found.setdefault(path, []).append(v.numpy().copy())
    return found


def belongs_to(path, name):
    last = path.split("/")[-1]
    return last == name or last.startswith(name + "_")


@pytest.mark.parametrize(
    "name", [param_if_shipped(name, CLASSES.get(name)) for name in sorted(OPTIMIZERS)]
)
def test_kept_variables_keep_every_slot_and_new_ones_start_fresh(name):
    a, b, c = variables()
    optimizer = OPTIMIZERS[name]()
    assert rebuild.rebuild(optimizer, [a, b])
    train(optimizer, [a, b])
    before = state(optimizer)

    assert rebuild.rebuild(optimizer, [a, c])
    assert [id(v) for v in rebuild.built_variables(optimizer)] == [id(a), id(c)]
    after = state(optimizer)
    # Everything that belonged to `a` or to the optimizer itself is unchanged;
    # `b`'s slots are gone.
    for path, values in before.items():
        if belongs_to(path, "b"):
            assert path not in after
        else:
            assert len(after[path]) == len(values)
            for new, old in zip(after[path], values):
                np.testing.assert_array_equal(new, old, err_msg=path)
    # `c`'s slots are what a fresh optimizer builds for it.
    fresh = OPTIMIZERS[name]()
    fresh.build([c])
    fresh_state = state(fresh)
    new_paths = [p for p in after if p not in before]
    assert new_paths, "the new variable got no slot"
    for path in new_paths:
        assert belongs_to(path, "c"), path
        if name == "LossScale":  # The slots are the inner optimizer's.
            expected = fresh_state[
                path.replace("adam/", fresh.inner_optimizer.name + "/", 1)
            ]
        else:
            expected = fresh_state[path.replace(optimizer.name, fresh.name, 1)]
        if path.endswith("average"):
            expected = [c.numpy()]  # An EMA average starts at the variable's value.
        for new, value in zip(after[path], expected):
            np.testing.assert_array_equal(new, value, err_msg=path)
    # It trains on with the new set.
    train(optimizer, [a, c], steps=2)


@pytest.mark.parametrize("name", ["Adam", "LossScale"])
def test_rebuilding_for_the_same_variables_changes_nothing(name):
    # (Keras 3.10's LossScaleOptimizer does not record the variables it was
    # built for: they are read from the optimizer it wraps, else every call
    # would rebuild it and drop its slots.)
    a, b, _ = variables()
    optimizer = OPTIMIZERS[name]()
    rebuild.rebuild(optimizer, [a, b])
    train(optimizer, [a, b])
    slots = list(optimizer.variables)
    assert not rebuild.rebuild(optimizer, [a, b])
    assert all(x is y for x, y in zip(optimizer.variables, slots))


def test_the_optimizer_object_and_its_step_survive():
    a, b, c = variables()
    optimizer = keras.optimizers.LossScaleOptimizer(keras.optimizers.Adam(0.1))
    rebuild.rebuild(optimizer, [a])
    train(optimizer, [a], steps=4)
    iterations = int(optimizer.iterations.numpy())
    scale = float(optimizer.dynamic_scale.numpy())
    rebuild.rebuild(optimizer, [a, b, c])
    assert int(optimizer.iterations.numpy()) == iterations == 4
    assert float(optimizer.dynamic_scale.numpy()) == scale
    assert len(rebuild.built_variables(optimizer.inner_optimizer)) == 3
