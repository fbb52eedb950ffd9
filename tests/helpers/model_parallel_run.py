"""The runs of tests/backend/test_model_parallel.py, in a process of their own.

JAX fixes its devices when it starts, so the test runs this script with
`XLA_FLAGS=--xla_force_host_platform_device_count=8 KERAS_BACKEND=jax`:

    python tests/helpers/model_parallel_run.py mlp|llama OUT.npz

It trains a masked model under `keras.distribution.ModelParallel` on a 2x4
mesh (`batch` x `model`) with AdamW (weight decay moves an unmasked frozen
entry): `mlp`, four Dense layers split by a hand `LayoutMap`, carrying an
`ElementMask` (replaced mid-fit by one that freezes more), a `PiecewiseMask`
of learning-rate multipliers, magnitude pruning and an `OutputMask`; `llama`, a tiny keras_hub Llama split by
`LlamaBackbone.get_layout_map`, with `ElementMask`s and `OutputMask`s on its
first decoder block. It saves, per masked variable and per device, the
variable's shard before and after, which entries must hold (or be 0), where
each device's shard of the variable and of its mask sit in the full arrays,
where they would sit for a replicated mask (the test's check must fail on
those), and `maskfit.mask_memory`'s bytes per device.
"""

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import jax  # noqa: E402
import keras  # noqa: E402
import numpy as np  # noqa: E402

import maskfit  # noqa: E402
from maskfit import pruning  # noqa: E402
from maskfit.backend import jax as jax_backend  # noqa: E402

STEPS = 8
BATCH = 16


def _mesh():
    devices = jax.devices("cpu")
    assert len(devices) == 8, f"expected 8 CPU devices, found {devices}"
    return keras.distribution.DeviceMesh(
        (2, 4), ["batch", "model"], keras.distribution.list_devices("cpu")
    )


def _keep(shape, seed, values=(0.0, 1.0)):
    rng = np.random.default_rng(seed)
    return rng.choice(np.asarray(values, np.float32), size=shape)


def mlp():
    """The Dense model and `{path: (frozen, zero)}`: entries that hold, entries at 0."""
    layout_map = keras.distribution.LayoutMap(_mesh())
    layout_map["up/kernel"] = (None, "model")
    layout_map["up/bias"] = ("model",)
    layout_map["mid/kernel"] = ("model", None)
    layout_map["pruned/kernel"] = (None, "model")
    layout_map["head/kernel"] = ("model", None)
    keras.distribution.set_distribution(
        keras.distribution.ModelParallel(layout_map=layout_map, batch_dim_name="batch")
    )
    keras.utils.set_random_seed(3)
    up_keep = _keep((16, 32), 0)
    mid = [_keep((32, 32), 1, (0.0, 0.5, 1.0)), _keep((32, 32), 2, (0.0, 0.25, 1.0))]
    head_units = [1.0, 0.0] * 4
    inputs = keras.Input((16,))
    up = maskfit.set_mask(
        keras.layers.Dense(32, activation="relu", name="up"),
        maskfit.ElementMask({"kernel": up_keep}),
    )
    middle = maskfit.set_mask(
        keras.layers.Dense(32, activation="relu", name="mid"),
        maskfit.PiecewiseMask([3], [maskfit.ElementMask({"kernel": m}) for m in mid]),
    )
    pruned = pruning.prune_low_magnitude(
        keras.layers.Dense(32, activation="relu", name="pruned"),
        pruning.ConstantSparsity(0.5, begin_step=2, end_step=6, frequency=2),
    )
    head = maskfit.set_mask(
        keras.layers.Dense(8, name="head"), maskfit.OutputMask(head_units)
    )
    model = maskfit.MaskedModel(inputs, head(pruned(middle(up(inputs)))))
    rng = np.random.default_rng(0)
    x = rng.normal(size=(STEPS * BATCH, 16)).astype("float32")
    y = rng.normal(size=(STEPS * BATCH, 8)).astype("float32")
    frozen = {
        up.kernel.path: up_keep == 0,
        middle.kernel.path: (mid[0] == 0) & (mid[1] == 0),
        pruned.kernel.path: None,  # its keep mask, read after training
        head.kernel.path: np.broadcast_to(np.array(head_units) == 0, (32, 8)),
        head.bias.path: np.array(head_units) == 0,
    }
    # Mid-fit, a new mask of the same shape on `up` (it freezes more): read
    # while the variables' values are out of them, laid out from the state's.
    later = up_keep * _keep((16, 32), 4)
    callback = _SetMaskAt(3, up, maskfit.ElementMask({"kernel": later}))
    return model, (x, y), frozen, ([callback], {up.kernel.path: later != 0})


class _SetMaskAt(keras.callbacks.Callback):
    def __init__(self, batch, layer, spec):
        super().__init__()
        self.batch, self.layer, self.spec = batch, layer, spec

    def on_train_batch_end(self, batch, logs=None):
        if batch == self.batch:
            maskfit.set_mask(self.layer, self.spec)


def llama():
    """A tiny keras_hub Llama split by its own layout map, masks on block 0."""
    import keras_hub

    layout_map = keras_hub.models.LlamaBackbone.get_layout_map(_mesh())
    keras.distribution.set_distribution(
        keras.distribution.ModelParallel(layout_map=layout_map, batch_dim_name="batch")
    )
    keras.utils.set_random_seed(3)
    backbone = keras_hub.models.LlamaBackbone(
        vocabulary_size=64,
        num_layers=2,
        num_query_heads=4,
        num_key_value_heads=4,
        hidden_dim=32,
        intermediate_dim=64,
    )
    block = backbone.get_layer("transformer_layer_0")
    attention = block._self_attention_layer
    frozen = {}
    for seed, dense in enumerate(
        (attention._query_dense, attention._key_dense, block._feedforward_gate_dense)
    ):
        keep = _keep(tuple(dense.kernel.shape), seed)
        maskfit.set_mask(dense, maskfit.ElementMask({"kernel": keep}))
        frozen[dense.kernel.path] = keep == 0
    units = np.tile([1.0, 0.0], 16)
    output = block._feedforward_output_dense
    maskfit.set_mask(output, maskfit.OutputMask(units))
    frozen[output.kernel.path] = np.broadcast_to(units == 0, output.kernel.shape)
    model = maskfit.MaskedModel(backbone.input, backbone.output)
    rng = np.random.default_rng(0)
    n = STEPS * BATCH
    x = {
        "token_ids": rng.integers(0, 64, size=(n, 8)).astype("int32"),
        "padding_mask": np.ones((n, 8), "int32"),
    }
    y = rng.normal(size=(n, 8, 32)).astype("float32")
    return model, (x, y), frozen, ([], {})


def _index(sharding, shape):
    """`{device id: [[start, stop], ...]}`: where each device's shard sits."""
    found = {}
    for device, index in sharding.devices_indices_map(tuple(shape)).items():
        found[device.id] = np.array(
            [s.indices(n)[:2] for s, n in zip(index, shape)], np.int64
        ).reshape(len(shape), 2)
    return found


def _shards(variable):
    return {s.device.id: np.array(s.data) for s in variable.value.addressable_shards}


def main(kind, out):
    model, (x, y), frozen, (callbacks, last) = {"mlp": mlp, "llama": llama}[kind]()
    model.compile(
        optimizer=keras.optimizers.AdamW(0.05, weight_decay=0.1),
        loss="mse",
        jit_compile=True,
    )
    variables = {v.path: v for v in model.trainable_variables}
    before = {path: _shards(variables[path]) for path in frozen}
    history = model.fit(
        x,
        y,
        batch_size=BATCH,
        epochs=1,
        shuffle=False,
        verbose=0,
        callbacks=callbacks,
    )
    masks = jax_backend.given_masks(model)
    # What a user's own jit loop gets: the declared masks (no keep masks).
    declared = maskfit.stateless_masks(model)
    memory = maskfit.mask_memory(model, print_fn=print)
    arrays = {"losses": np.array(history.history["loss"])}
    position = {v.path: i for i, v in enumerate(model.trainable_variables)}
    for path, held in frozen.items():
        variable, key = variables[path], path.replace("/", "__")
        table = masks.tables[masks.positions.index(position[path])]
        if held is None:  # pruned: the keep mask the step was given
            arrays[f"zero:{key}"] = ~np.asarray(table)[0]
            held = np.zeros(variable.shape, bool)
        arrays[f"frozen:{key}"] = held
        if path in last:  # the mask set mid-fit, and the one the step was given
            arrays[f"last:{key}"] = last[path]
            arrays[f"given:{key}"] = np.asarray(table)[0]
        arrays[f"table_shape:{key}"] = np.array(table.shape)
        if position[path] in declared.positions:
            mine = declared.tables[declared.positions.index(position[path])]
            for device, value in _index(mine.sharding, mine.shape).items():
                arrays[f"sindex:{key}:{device}"] = value
        replicated = jax.sharding.NamedSharding(
            variable.value.sharding.mesh, jax.sharding.PartitionSpec()
        )
        for name, found in (
            ("vindex", _index(variable.value.sharding, variable.shape)),
            ("mindex", _index(table.sharding, table.shape)),
            ("replicated", _index(replicated, table.shape)),
            ("before", before[path]),
            ("after", _shards(variable)),
        ):
            for device, value in found.items():
                arrays[f"{name}:{key}:{device}"] = value
    ids = {str(d): d.id for d in jax.devices()}  # mask_memory names devices
    for row in memory.rows:
        key = row.path.replace("/", "__")
        for device, size in row.masks.items():
            arrays[f"mask_bytes:{key}:{ids[device]}"] = np.array(size)
        for device, size in row.variable.items():
            arrays[f"variable_bytes:{key}:{ids[device]}"] = np.array(size)
    np.savez(out, **arrays)
    print(f"model parallel ({kind}): ok on {len(jax.devices())} devices")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
