"""The legs of the cross-backend round trip of tests/model/test_across_backends.py.

A `.keras` file saved with masks under one backend must load and train on
under the other. Keras fixes its backend at import, so the TensorFlow legs
run this script in a subprocess (the JAX leg runs in the test's process):

    KERAS_BACKEND=tensorflow python tests/helpers/backend_roundtrip.py new OUT_DIR
    KERAS_BACKEND=tensorflow python tests/helpers/backend_roundtrip.py resume IN_DIR OUT_DIR
    KERAS_BACKEND=tensorflow python tests/helpers/backend_roundtrip.py pruned OUT_DIR
    KERAS_BACKEND=tensorflow python tests/helpers/backend_roundtrip.py load_pruned IN_DIR
    KERAS_BACKEND=jax python tests/helpers/backend_roundtrip.py resume IN_DIR OUT_DIR

`new` builds the model, trains it with AdamW (weight decay: a frozen entry
moves unless maskfit holds it), and saves it; `resume` loads a saved one,
trains it on and saves it again; `pruned` trains a model pruned by
`prune_low_magnitude` and saves it (`report.json` and `model.keras`);
`load_pruned` loads one pruned and saved under the other backend
(`check_pruned`). Each
leg of the round trip writes `model.keras` and
`leg.npz`: every trainable variable's value and the masks' configs, read
back by the next leg and by the test (`check_leg`).
"""

import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402

import maskfit  # noqa: E402

# Entries that learn in no leg: ElementMask zeros of the hidden kernel, the
# head's output 1 (OutputMask), all of layer "still" (a mask of zeros: on
# TensorFlow its variables get no optimizer state), and the gate's unit 0
# until step 6 (PiecewiseMask, which switches inside the compiled step of the
# second leg).
HIDDEN_KEEP = (np.arange(5 * 6).reshape(5, 6) % 4 != 0).astype("float32")
HEAD_UNITS = [1.0, 0.0, 0.5]  # 0.5: half the learning rate
STEPS = 4  # per leg (batch 8 of 32 examples, one epoch)


def build():
    inputs = keras.Input((5,))
    hidden = maskfit.set_mask(
        keras.layers.Dense(6, activation="tanh", name="hidden"),
        maskfit.ElementMask({"kernel": HIDDEN_KEEP}),
    )
    gate = maskfit.set_mask(
        keras.layers.Dense(6, name="gate"),
        maskfit.PiecewiseMask(
            [6], [maskfit.OutputMask([0, 1, 1, 1, 1, 1]), maskfit.OutputMask([1] * 6)]
        ),
    )
    head = maskfit.set_mask(
        keras.layers.Dense(3, name="head"), maskfit.OutputMask(HEAD_UNITS)
    )
    still = maskfit.set_mask(
        keras.layers.Dense(6, name="still"), maskfit.OutputMask([0] * 6)
    )
    model = maskfit.MaskedModel(inputs, head(still(gate(hidden(inputs)))))
    model.compile(optimizer=keras.optimizers.AdamW(0.05, weight_decay=0.1), loss="mse")
    return model


def data():
    rng = np.random.default_rng(7)
    return rng.normal(size=(32, 5)).astype("float32"), rng.normal(size=(32, 3))


def frozen(model):
    """`{variable path: bool array}`: the entries no leg may move."""
    hidden = model.get_layer("hidden")
    head = model.get_layer("head")
    gate = model.get_layer("gate")
    return {
        hidden.kernel.path: HIDDEN_KEEP == 0,
        head.kernel.path: np.broadcast_to(np.array(HEAD_UNITS) == 0, (6, 3)),
        head.bias.path: np.array(HEAD_UNITS) == 0,
        # The gate's unit 0 is frozen below optimizer step 6 (all of leg 1,
        # checked there) and learns from then on: all of it moves in leg 2.
        gate.kernel.path: np.zeros((6, 6), bool),
        model.get_layer("still").kernel.path: np.ones((6, 6), bool),
        model.get_layer("still").bias.path: np.ones((6,), bool),
    }


def masks(model):
    return {
        layer.name: keras.saving.serialize_keras_object(maskfit.get_mask(layer))
        for layer in model.layers
        if maskfit.get_mask(layer) is not None
    }


def values(model):
    # model.weights: a MaskedModel on TensorFlow reports a variable whose mask
    # is all 0 as non-trainable; it is still a trainable variable of its layer.
    return {v.path: np.array(v.numpy()) for v in model.weights if v.trainable}


def slots(model):
    """The optimizer's variables by path (its step, slots, EMA averages)."""
    return {v.path: np.array(v.numpy()) for v in model.optimizer.variables}


def layer_key(path):
    """`layer/variable`: a path without the prefix a Sequential built in place
    gives its layers' variables (`sequential/hidden/kernel`) and a loaded
    one does not."""
    return "/".join(path.split("/")[-2:])


def report(model):
    """What the leg's model says: its summary's counts, loss and predictions."""
    x, y = data()
    table = maskfit.summary(model, print_fn=None)
    return {
        "summary": [
            [layer_key(row.path), row.params, row.learnable, row.mask_kind, row.pruned]
            for row in table.rows
        ],
        "loss": float(model.evaluate(x, y, batch_size=8, verbose=0)),
        "predictions": model.predict(x, batch_size=8, verbose=0).tolist(),
    }


def write_leg(model, out_dir):
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "report.json"), "w") as f:
        json.dump(report(model), f)
    model.save(os.path.join(out_dir, "model.keras"))
    flat = {path.replace("/", "__"): v for path, v in values(model).items()}
    np.savez(os.path.join(out_dir, "leg.npz"), **flat)
    flat = {path.replace("/", "__"): v for path, v in slots(model).items()}
    np.savez(os.path.join(out_dir, "slots.npz"), **flat)
    with open(os.path.join(out_dir, "masks.json"), "w") as f:
        json.dump(masks(model), f)
    with open(os.path.join(out_dir, "step.json"), "w") as f:
        json.dump(int(model.optimizer.iterations.numpy()), f)


def read_npz(path):
    with np.load(path) as saved:
        return {k.replace("__", "/"): saved[k] for k in saved.files}


def read_leg(out_dir):
    """`(values, optimizer variables, masks, optimizer step)` from `write_leg`."""
    weights = read_npz(os.path.join(out_dir, "leg.npz"))
    optimizer = read_npz(os.path.join(out_dir, "slots.npz"))
    with open(os.path.join(out_dir, "masks.json")) as f:
        saved_masks = json.load(f)
    with open(os.path.join(out_dir, "step.json")) as f:
        step = json.load(f)
    return weights, optimizer, saved_masks, step


def train(model):
    x, y = data()
    model.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0)


def check_leg(model, before_dir):
    """Asserts the loaded `model` matches leg `before_dir`, then trains it and
    asserts that frozen entries stayed and the others learned."""
    weights, optimizer, saved_masks, step = read_leg(before_dir)
    assert masks(model) == saved_masks
    assert int(model.optimizer.iterations.numpy()) == step
    for path, value in values(model).items():
        np.testing.assert_array_equal(value, weights[path], err_msg=path)
    loaded = slots(model)
    # A variable whose mask is all 0 has no state in a file saved on
    # TensorFlow; everything else carries over.
    assert set(optimizer) <= set(loaded)
    for path, value in optimizer.items():
        np.testing.assert_array_equal(loaded[path], value, err_msg=path)
    # summary, evaluate and predict: the same on this backend (up to float32
    # rounding: another backend's kernels may round differently).
    with open(os.path.join(before_dir, "report.json")) as f:
        saved = json.load(f)
    now = report(model)
    assert now["summary"] == saved["summary"]
    np.testing.assert_allclose(now["loss"], saved["loss"], rtol=1e-5)
    np.testing.assert_allclose(
        now["predictions"], saved["predictions"], rtol=1e-5, atol=1e-6
    )
    hold = frozen(model)
    train(model)
    after = values(model)
    for path, keep_frozen in hold.items():
        np.testing.assert_array_equal(
            after[path][keep_frozen], weights[path][keep_frozen], err_msg=path
        )
        assert np.all(after[path][~keep_frozen] != weights[path][~keep_frozen]), path


def pruned(out_dir):
    """Prunes an MLP to 50% on TensorFlow, trains it, saves it and its report."""
    import maskfit.pruning as pruning

    keras.utils.set_random_seed(4)
    model = pruning.prune_low_magnitude(
        keras.Sequential(
            [
                keras.Input((5,)),
                keras.layers.Dense(8, activation="relu", name="hidden"),
                keras.layers.Dense(3, name="head"),
            ]
        ),
        pruning.ConstantSparsity(0.5, begin_step=0, frequency=1),
    )
    model.compile(optimizer="adam", loss="mse")
    train(model)
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "report.json"), "w") as f:
        json.dump(report(model), f)
    model.save(os.path.join(out_dir, "model.keras"))
    flat = {layer_key(p).replace("/", "__"): v for p, v in values(model).items()}
    np.savez(os.path.join(out_dir, "leg.npz"), **flat)


def check_pruned(in_dir):
    """Asserts a model `pruned` saved (under either backend) loads here with its
    rule, summary, loss, predictions and weights, strips to a plain Sequential,
    and keeps its sparsity when trained on."""
    import maskfit.pruning as pruning
    from maskfit.spec import rules

    with open(os.path.join(in_dir, "report.json")) as f:
        saved = json.load(f)
    weights = read_npz(os.path.join(in_dir, "leg.npz"))
    model = keras.saving.load_model(os.path.join(in_dir, "model.keras"))
    assert [type(rule).__name__ for _, rule in rules.layer_rules(model)] == [
        "MagnitudePruning"
    ]
    now = report(model)
    assert now["summary"] == saved["summary"]
    assert maskfit.summary(model, print_fn=None).pruned_params > 0
    np.testing.assert_allclose(now["loss"], saved["loss"], rtol=1e-5)
    np.testing.assert_allclose(
        now["predictions"], saved["predictions"], rtol=1e-5, atol=1e-6
    )
    stripped = pruning.strip_pruning(model)
    assert type(stripped) is keras.Sequential
    assert not rules.layer_rules(stripped)
    for variable in stripped.trainable_weights:
        np.testing.assert_array_equal(
            variable.numpy(), weights[layer_key(variable.path)]
        )
    # Trained on: the rule (50% every step) keeps pruning its kernels.
    train(model)
    for name in ("hidden", "head"):
        kernel = model.get_layer(name).kernel.numpy()
        assert int(np.count_nonzero(kernel)) == kernel.size // 2, name


def run_on_tensorflow(*args):
    """Runs this script's `args` in a TensorFlow subprocess; asserts it passed."""
    run_on("tensorflow", *args)


def run_on(backend, *args):
    """Runs this script's `args` in a subprocess on `backend`; asserts it passed."""
    import subprocess

    from tests.helpers import checkout

    env = checkout.env(KERAS_BACKEND=backend, TF_CPP_MIN_LOG_LEVEL="2")
    result = subprocess.run(
        [sys.executable, os.path.abspath(__file__), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout + result.stderr[-4000:]
    assert f"{args[0]}: ok under {backend}" in result.stdout


def main(argv):
    command, *dirs = argv
    if command == "new":
        keras.utils.set_random_seed(3)
        model = build()
        gate = model.get_layer("gate").kernel
        unit_0 = np.array(gate.numpy()[:, 0])
        train(model)
        # PiecewiseMask: the gate's unit 0 is frozen until step 6.
        np.testing.assert_array_equal(gate.numpy()[:, 0], unit_0)
        write_leg(model, dirs[0])
    elif command == "pruned":
        pruned(dirs[0])
        print("pruned: ok under tensorflow")
        return
    elif command == "load_pruned":
        check_pruned(dirs[0])
    elif command == "resume":
        model = keras.saving.load_model(os.path.join(dirs[0], "model.keras"))
        check_leg(model, dirs[0])
        write_leg(model, dirs[1])
    else:
        raise SystemExit(
            f"unknown command {command!r}: new OUT | resume IN OUT | pruned OUT"
            " | load_pruned IN"
        )
    print(f"{command}: ok under {keras.backend.backend()}")


if __name__ == "__main__":
    main(sys.argv[1:])
