"""Step time and per-device mask memory under `keras.distribution.ModelParallel` (JAX).

Contenders side by side in one process, on a `batch` x `model` device mesh
(`mesh`, 2x4 by default: 8 devices, which `__main__` makes of the CPU): for
each model, stock `keras.Model` and the same model with an `OutputMask`
(every other unit of each Dense layer frozen) or a 90% `ElementMask` (on the
kernel of every Dense and EinsumDense layer), each compiled with
`jit_compile=True` under the same `ModelParallel`: `mlp`, Dense layers split
Megatron-style by a hand `LayoutMap` (column-split then row-split, in turn);
`llama`, a keras_hub `LlamaBackbone` built from constructor arguments, split
by its own `LlamaBackbone.get_layout_map`, under a token classifier. Each is
timed through its own `train_function` on one fixed batch laid out by the
distribution, round-robin (`benchmarks.harness.round_robin`), and reported
as the median of per-round ratios to stock, of wall time and of the
process's CPU time. Beside the times, each masked row gives the bytes of
masks the most loaded device holds and of the masked variables there
(`maskfit.mask_memory`): under ModelParallel each device holds its shard of
each mask.
"""

import dataclasses

import keras
import numpy as np

import maskfit
from benchmarks import harness
from benchmarks.step_time import lib as step_time

DEVICES = 8  # what `__main__` splits the CPU into, unless XLA_FLAGS says
COLUMNS = (
    "model",
    "mask",
    *harness.RATIO_COLUMNS,
    "mask_bytes",
    "variable_bytes",
    "mask_ratio",
)


@dataclasses.dataclass
class Config(harness.TimingConfig):
    """What to measure.

    The timing fields and `seed` of `harness.TimingConfig`, and:

    Attributes:
      models: Models: mlp, llama.
      masks: Mask kinds besides stock: output, element.
      mesh: The device mesh, batch x model (their product: the devices used).
      optimizer: adamw or sgd.
      mlp_depth: Hidden Dense layers of the MLP.
      mlp_width: Units per MLP layer.
      mlp_batch: MLP batch size.
      llama_layers: Decoder blocks of the Llama.
      llama_hidden: Its hidden size.
      llama_heads: Its query heads (as many key/value heads).
      llama_intermediate: Its feed-forward size.
      llama_vocabulary: Its vocabulary (and the classifier's classes).
      llama_sequence: Tokens per example.
      llama_batch: Llama batch size.
      sparsity: Frozen share under ElementMask.
    """

    models: tuple = ("mlp", "llama")
    masks: tuple = ("output", "element")
    mesh: tuple = (2, 4)
    optimizer: str = "adamw"
    mlp_depth: int = 4
    mlp_width: int = 1024
    mlp_batch: int = 256
    llama_layers: int = 2
    llama_hidden: int = 256
    llama_heads: int = 8
    llama_intermediate: int = 1024
    llama_vocabulary: int = 512
    llama_sequence: int = 64
    llama_batch: int = 16
    sparsity: float = 0.9


def _mesh(config):
    devices = keras.distribution.list_devices()
    need = int(np.prod(config.mesh))
    if len(devices) < need:
        raise RuntimeError(
            f"benchmarks.model_parallel needs {need} devices for a"
            f" {'x'.join(map(str, config.mesh))} mesh; this process has"
            f" {len(devices)}. Run it as `python -m benchmarks.model_parallel`"
            " (which splits the CPU into 8), or set XLA_FLAGS="
            f"--xla_force_host_platform_device_count={need} before JAX starts."
        )
    return keras.distribution.DeviceMesh(
        tuple(config.mesh), ["batch", "model"], devices[:need]
    )


def _mlp_layout(mesh, config):
    layout_map = keras.distribution.LayoutMap(mesh)
    for i in range(config.mlp_depth):
        if i % 2 == 0:  # column-split, then row-split: no gather in between
            layout_map[f"dense_{i}/kernel"] = (None, "model")
            layout_map[f"dense_{i}/bias"] = ("model",)
        else:
            layout_map[f"dense_{i}/kernel"] = ("model", None)
    return layout_map


def _mlp(config, model_class, rng):
    inputs = keras.Input((config.mlp_width,))
    hidden = inputs
    for i in range(config.mlp_depth):
        dense = keras.layers.Dense(
            config.mlp_width, activation="relu", name=f"dense_{i}"
        )
        hidden = dense(hidden)
    model = model_class(inputs, keras.layers.Dense(10, name="head")(hidden))
    x = rng.standard_normal((config.mlp_batch, config.mlp_width)).astype(np.float32)
    return model, x, rng.integers(0, 10, size=(config.mlp_batch,)).astype(np.int32)


def _llama(config, model_class, rng):
    import keras_hub

    backbone = keras_hub.models.LlamaBackbone(
        vocabulary_size=config.llama_vocabulary,
        num_layers=config.llama_layers,
        num_query_heads=config.llama_heads,
        num_key_value_heads=config.llama_heads,
        hidden_dim=config.llama_hidden,
        intermediate_dim=config.llama_intermediate,
    )
    logits = keras.layers.Dense(config.llama_vocabulary, name="classifier")(
        backbone.output
    )
    model = model_class(backbone.input, logits)
    shape = (config.llama_batch, config.llama_sequence)
    x = {
        "token_ids": rng.integers(0, config.llama_vocabulary, size=shape).astype(
            np.int32
        ),
        "padding_mask": np.ones(shape, np.int32),
    }
    return (
        model,
        x,
        rng.integers(0, config.llama_vocabulary, size=shape).astype(np.int32),
    )


class _Timed(harness.Timed):
    """One compiled model and its state, stepped by its own `train_function`,
    on a batch laid out by the distribution (as `fit` lays out its batches)."""

    def prepare(self, x, y, steps_per_execution):
        import jax

        del steps_per_execution  # one epoch of one batch builds the function
        self.model.fit(x, y, batch_size=len(y), epochs=1, shuffle=False, verbose=0)
        copy = lambda v: jax.numpy.array(v.value, copy=True)  # noqa: E731
        self.state = (
            [copy(v) for v in self.model.trainable_variables],
            [copy(v) for v in self.model.non_trainable_variables],
            [copy(v) for v in self.model.optimizer.variables],
            [copy(v) for v in self.model.metrics_variables],
        )
        distribution = keras.distribution.distribution()

        def laid_out(array):
            layout = distribution.get_data_layout(array.shape)
            return keras.distribution.distribute_tensor(array, layout)

        batch = jax.tree_util.tree_map(laid_out, (x, y))
        return iter(lambda: batch, None)  # the same batch, endlessly

    def call(self):
        logs, self.state = self.model.train_function(self.state, self.iterator)
        return logs


def _contender(config, model_name, mask, mesh):
    keras.utils.set_random_seed(config.seed)
    rng = np.random.default_rng(config.seed)
    if model_name == "llama":
        import keras_hub

        layout_map = keras_hub.models.LlamaBackbone.get_layout_map(mesh)
    else:
        layout_map = _mlp_layout(mesh, config)
    keras.distribution.set_distribution(
        keras.distribution.ModelParallel(layout_map=layout_map, batch_dim_name="batch")
    )
    model_class = keras.Model if mask == "none" else maskfit.MaskedModel
    build = _llama if model_name == "llama" else _mlp
    model, x, y = build(config, model_class, rng)
    step_time.set_masks(model, mask, config.sparsity, config.seed)
    model.compile(
        optimizer=harness.optimizer(config.optimizer),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        jit_compile=True,
        steps_per_execution=config.steps_per_execution,
    )
    return _Timed.of_config((model_name, mask), model, x, y, config)


def _memory(contender):
    """`(mask bytes, masked variables' bytes)` on the device holding most masks."""
    if contender.key[1] == "none":
        return {"mask_bytes": None, "variable_bytes": None, "mask_ratio": None}
    memory = maskfit.mask_memory(contender.model, print_fn=None)
    device = max(memory.masks, key=memory.masks.get)
    held, weights = memory.masks[device], memory.variables[device]
    return {"mask_bytes": held, "variable_bytes": weights, "mask_ratio": held / weights}


def _measure(config, model_name, mesh):
    contenders = [
        _contender(config, model_name, mask, mesh) for mask in ("none",) + config.masks
    ]
    times, cpu_times = harness.round_robin(contenders, config.repeats)
    rows = []
    for contender in contenders:
        row = dict(zip(COLUMNS, contender.key))
        row.update(
            harness.ratio_row(times, cpu_times, contender.key, contenders[0].key)
        )
        row.update(_memory(contender))
        harness.log_ratio_row(" ".join(contender.key), row)
        rows.append(row)
    return rows


def format_table(rows):
    """Returns `rows` as a fixed-width text table, one line per contender."""
    lines = [
        f"{'model':5} {'mask':7} {harness.RATIO_HEADER}"
        f" {'mask B/dev':>10} {'var B/dev':>10} {'mask/var':>8}"
    ]
    for row in rows:
        memory = (
            f" {'-':>10} {'-':>10} {'-':>8}"
            if row["mask_bytes"] is None
            else f" {row['mask_bytes']:>10,} {row['variable_bytes']:>10,}"
            f" {row['mask_ratio']:8.3f}"
        )
        lines.append(
            f"{row['model']:5} {row['mask']:7} {harness.ratio_cells(row)}{memory}"
        )
    return "\n".join(lines)


def run(config, workdir):
    """Times every model's contenders; writes `model_parallel.{json,csv}` to `workdir`.

    Args:
      config: a `Config`.
      workdir: a directory; created if missing.

    Returns:
      The rows of the table, as dicts with the keys in `COLUMNS`.

    Raises:
      RuntimeError: when Keras does not run on JAX in this process, or it
        has fewer devices than the mesh.
    """
    if keras.backend.backend() != "jax":
        raise RuntimeError(
            "benchmarks.model_parallel measures Keras's JAX backend, but this"
            f" process runs Keras on '{keras.backend.backend()}'. Run it as"
            " `python -m benchmarks.model_parallel` (which selects JAX) or set"
            " KERAS_BACKEND=jax before Keras is imported."
        )
    mesh = _mesh(config)
    harness.write_config(workdir, config)
    rows = []
    try:
        for model_name in config.models:
            rows.extend(_measure(config, model_name, mesh))
    finally:
        keras.distribution.set_distribution(None)
    import jax

    machine = dict(
        harness.machine(),
        backend="jax",
        jax=jax.__version__,
        device=jax.devices()[0].device_kind,
        devices=len(jax.devices()),
        mesh="x".join(map(str, config.mesh)),
    )
    harness.write_json(
        workdir, "model_parallel.json", {"machine": machine, "rows": rows}
    )
    harness.write_csv(workdir, "model_parallel.csv", rows, COLUMNS)
    return rows
