"""Step time of `MaskedModel` against stock `keras.Model` on Keras's JAX backend.

Contenders side by side in one process: for each model (the 4x1024 MLP of
`benchmarks.step_time`, a small keras_hub BERT built from constructor
arguments), stock Keras and the same model with an `OutputMask` (every other
unit of each Dense layer frozen) or a 90% `ElementMask` (on the kernel of every
Dense and EinsumDense layer), each compiled with `jit_compile=True`. Each is
timed through its own `train_function` (the function `fit` calls) on one fixed
batch, round-robin (`benchmarks.harness.round_robin`), and reported as the
median of per-round ratios to stock, of wall time and of the process's CPU
time (which other processes on a shared machine sway less).
"""

import dataclasses

import keras
import numpy as np

import maskfit
from benchmarks import harness
from benchmarks.step_time import lib as step_time
from maskfit import internals

COLUMNS = (
    "model",
    "mask",
    *harness.RATIO_COLUMNS,
)
_STEP_TIME = step_time.Config()


@dataclasses.dataclass
class Config(harness.TimingConfig):
    """What to measure; the MLP, the sparsity and the timing default to
    `benchmarks.step_time`'s (`_STEP_TIME`; both time as `harness.TimingConfig`
    says), so that the two tables compare.

    The timing fields and `seed` of `harness.TimingConfig`, and:

    Attributes:
      models: Models: mlp, bert.
      masks: Mask kinds besides stock: output, element.
      optimizer: adamw or sgd.
      mlp_depth: Hidden Dense layers of the MLP.
      mlp_width: Units per MLP layer.
      mlp_batch: MLP batch size.
      bert_layers: Transformer layers of the BERT.
      bert_hidden: Its hidden size.
      bert_heads: Its attention heads.
      bert_intermediate: Its feed-forward size.
      bert_vocabulary: Its vocabulary.
      bert_sequence: Tokens per example.
      bert_batch: BERT batch size.
      sparsity: Frozen share under ElementMask.
    """

    models: tuple = ("mlp", "bert")
    masks: tuple = ("output", "element")
    optimizer: str = "adamw"
    mlp_depth: int = _STEP_TIME.mlp_depth
    mlp_width: int = _STEP_TIME.mlp_width
    mlp_batch: int = _STEP_TIME.mlp_batch
    bert_layers: int = 2
    bert_hidden: int = 128
    bert_heads: int = 2
    bert_intermediate: int = 512
    bert_vocabulary: int = 5000
    bert_sequence: int = 128
    bert_batch: int = 32
    sparsity: float = _STEP_TIME.sparsity


def _mlp(config, model_class, rng):
    inputs = keras.Input((config.mlp_width,))
    hidden = inputs
    for _ in range(config.mlp_depth):
        hidden = keras.layers.Dense(config.mlp_width, activation="relu")(hidden)
    model = model_class(inputs, keras.layers.Dense(10)(hidden))
    x = rng.standard_normal((config.mlp_batch, config.mlp_width)).astype(np.float32)
    return model, x, rng.integers(0, 10, size=(config.mlp_batch,)).astype(np.int32)


def _bert(config, model_class, rng):
    import keras_hub

    backbone = keras_hub.models.BertBackbone(
        vocabulary_size=config.bert_vocabulary,
        num_layers=config.bert_layers,
        num_heads=config.bert_heads,
        hidden_dim=config.bert_hidden,
        intermediate_dim=config.bert_intermediate,
        max_sequence_length=config.bert_sequence,
    )
    inputs = {
        name: keras.Input((config.bert_sequence,), dtype="int32", name=name)
        for name in ("token_ids", "segment_ids", "padding_mask")
    }
    pooled = backbone(inputs)["pooled_output"]
    model = model_class(inputs, keras.layers.Dense(2, name="classifier")(pooled))
    shape = (config.bert_batch, config.bert_sequence)
    x = {
        "token_ids": rng.integers(0, config.bert_vocabulary, size=shape),
        "segment_ids": np.zeros(shape, np.int32),
        "padding_mask": np.ones(shape, np.int32),
    }
    x = {k: v.astype(np.int32) for k, v in x.items()}
    return model, x, rng.integers(0, 2, size=(config.bert_batch,)).astype(np.int32)


def _set_masks(model, mask, sparsity, seed):
    rng = np.random.default_rng(seed + 1)
    for layer in internals.sublayers(model):
        kernel = getattr(layer, "kernel", None)
        if not layer.trainable_weights or kernel is None:
            continue
        if mask == "output" and isinstance(layer, keras.layers.Dense):
            units = kernel.shape[-1]
            maskfit.set_mask(layer, maskfit.OutputMask(np.arange(units) % 2))
        elif mask == "element" and isinstance(
            layer, (keras.layers.Dense, keras.layers.EinsumDense)
        ):
            keep = rng.random(tuple(kernel.shape)) >= sparsity
            maskfit.set_mask(layer, maskfit.ElementMask({"kernel": keep}))


class _Timed(harness.Timed):
    """One compiled model and its state, stepped by its own `train_function`.

    On JAX the train function takes the model's state and returns the next
    one, so the state stays here between calls.
    """

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
        batch = jax.tree_util.tree_map(jax.numpy.asarray, (x, y))
        return iter(lambda: batch, None)  # the same batch, endlessly

    def call(self):
        logs, self.state = self.model.train_function(self.state, self.iterator)
        return logs


def _contender(config, model_name, mask):
    keras.utils.set_random_seed(config.seed)
    model_class = keras.Model if mask == "none" else maskfit.MaskedModel
    build = {"mlp": _mlp, "bert": _bert}[model_name]
    model, x, y = build(config, model_class, np.random.default_rng(config.seed))
    _set_masks(model, mask, config.sparsity, config.seed)
    model.compile(
        optimizer=harness.optimizer(config.optimizer),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        jit_compile=True,
        steps_per_execution=config.steps_per_execution,
    )
    return _Timed.of_config((model_name, mask), model, x, y, config)


def _measure(config, model_name):
    contenders = [
        _contender(config, model_name, mask) for mask in ("none",) + config.masks
    ]
    times, cpu_times = harness.round_robin(contenders, config.repeats)
    rows = []
    for contender in contenders:
        row = dict(zip(COLUMNS, contender.key))
        row.update(
            harness.ratio_row(times, cpu_times, contender.key, (model_name, "none"))
        )
        rows.append(row)
        harness.log_ratio_row(" ".join(contender.key), row)
    return rows


def format_table(rows):
    """Returns `rows` as a fixed-width text table, one line per contender."""
    lines = [f"{'model':5} {'mask':7} {harness.RATIO_HEADER}"]
    for row in rows:
        lines.append(f"{row['model']:5} {row['mask']:7} {harness.ratio_cells(row)}")
    return "\n".join(lines)


def run(config, workdir):
    """Times every model's contenders; writes `jax_step_time.{json,csv}` to `workdir`.

    Args:
      config: a `Config`.
      workdir: a directory; created if missing.

    Returns:
      The rows of the table, as dicts with the keys in `COLUMNS`.

    Raises:
      RuntimeError: when Keras does not run on JAX in this process.
    """
    if keras.backend.backend() != "jax":
        raise RuntimeError(
            "benchmarks.jax_step_time measures Keras's JAX backend, but this"
            f" process runs Keras on '{keras.backend.backend()}'. Run it as"
            " `python -m benchmarks.jax_step_time` (which selects JAX) or set"
            " KERAS_BACKEND=jax before Keras is imported."
        )
    harness.write_config(workdir, config)
    rows = []
    for model_name in config.models:
        rows.extend(_measure(config, model_name))
    machine = dict(harness.machine(), backend="jax")
    harness.write_json(
        workdir, "jax_step_time.json", {"machine": machine, "rows": rows}
    )
    harness.write_csv(workdir, "jax_step_time.csv", rows, COLUMNS)
    return rows
