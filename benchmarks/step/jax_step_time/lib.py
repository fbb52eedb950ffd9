"""Step time of `MaskedModel` against stock `keras.Model` on Keras's JAX backend.

Contenders side by side in one process: for each model (the 4x1024 MLP of
`benchmarks.step_time`, a small keras_hub BERT built from constructor
arguments), stock Keras and the same model with an `OutputMask` (every other
unit of each Dense layer frozen) or a 90% `ElementMask` (on the kernel of every
Dense and EinsumDense layer), each compiled with `jit_compile=True`. Each is
timed through its own `train_function` (the function `fit` calls) on one fixed
batch, round-robin (`benchmarks.harness.round_robin`), and reported as the
median of per-round ratios to stock, of wall time and of the process's CPU
time (which other processes on a shared machine sway less). Beside the
times, each reports what XLA makes of its step (`benchmarks.hlo`): the
optimized HLO's fusions, kernels and bytes accessed (XLA's cost analysis),
and their ratios to stock's; `timing=False` reports those alone, for sizes
too slow to time here (the 4x4096 MLP, BERT-base).
"""

import dataclasses

import keras
import numpy as np

import maskfit
from benchmarks import harness, hlo
from benchmarks.step_time import lib as step_time

COLUMNS = (
    "model",
    "mask",
    *harness.RATIO_COLUMNS,
    *hlo.COLUMNS,
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
      masks: Mask kinds besides stock: output, element, pruning
        (`benchmarks.step_time.lib.set_masks`).
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
      hlo: Report the compiled steps' fusions, kernels and bytes accessed.
      timing: Time the steps (False: the HLO figures alone).
    """

    models: tuple = ("mlp", "bert")
    masks: tuple = ("output", "element")
    optimizer: str = "adamw"
    mlp_depth: int = _STEP_TIME.mlp_depth
    mlp_width: int = _STEP_TIME.mlp_width
    mlp_batch: int = _STEP_TIME.mlp_batch
    bert_layers: int = _STEP_TIME.bert_layers
    bert_hidden: int = _STEP_TIME.bert_hidden
    bert_heads: int = _STEP_TIME.bert_heads
    bert_intermediate: int = _STEP_TIME.bert_intermediate
    bert_vocabulary: int = _STEP_TIME.bert_vocabulary
    bert_sequence: int = _STEP_TIME.bert_sequence
    bert_batch: int = _STEP_TIME.bert_batch
    sparsity: float = _STEP_TIME.sparsity
    hlo: bool = True
    timing: bool = True


def _mlp(config, model_class, rng):
    inputs = keras.Input((config.mlp_width,))
    hidden = inputs
    for _ in range(config.mlp_depth):
        hidden = keras.layers.Dense(config.mlp_width, activation="relu")(hidden)
    model = model_class(inputs, keras.layers.Dense(10)(hidden))
    x = rng.standard_normal((config.mlp_batch, config.mlp_width)).astype(np.float32)
    return model, x, rng.integers(0, 10, size=(config.mlp_batch,)).astype(np.int32)


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
    rng = np.random.default_rng(config.seed)
    if model_name == "bert":
        model, (x, y) = step_time.bert(config, model_class, rng)
    else:
        model, x, y = _mlp(config, model_class, rng)
    step_time.set_masks(model, mask, config.sparsity, config.seed)
    model.compile(
        optimizer=harness.optimizer(config.optimizer),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        jit_compile=True,
        steps_per_execution=config.steps_per_execution,
    )
    key = (model_name, mask)
    if config.timing:
        contender = _Timed.of_config(key, model, x, y, config)
    else:
        contender = hlo.Untimed(key, model)
    contender.counts = hlo.jax_step(model, x, y) if config.hlo else None
    return contender


def _measure(config, model_name):
    contenders = [
        _contender(config, model_name, mask) for mask in ("none",) + config.masks
    ]
    if config.timing:
        times, cpu_times = harness.round_robin(contenders, config.repeats)
    stock = (model_name, "none")
    rows = []
    for contender in contenders:
        row = dict(zip(COLUMNS, contender.key))
        if config.timing:
            row.update(harness.ratio_row(times, cpu_times, contender.key, stock))
            harness.log_ratio_row(" ".join(contender.key), row)
        else:
            row.update(dict.fromkeys(harness.RATIO_COLUMNS))
        row.update(hlo.row(contender.counts, contenders[0].counts))
        hlo.log_row(" ".join(contender.key), row)
        rows.append(row)
    return rows


def format_table(rows):
    """Returns `rows` as a fixed-width text table, one line per contender."""
    lines = [f"{'model':5} {'mask':7} {harness.RATIO_HEADER} {hlo.HEADER}"]
    for row in rows:
        lines.append(
            f"{row['model']:5} {row['mask']:7} {harness.ratio_cells(row)}"
            f" {hlo.cells(row)}"
        )
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
    import jax

    machine = dict(
        harness.machine(),
        backend="jax",
        jax=jax.__version__,
        device=jax.devices()[0].device_kind,
    )
    harness.write_json(
        workdir, "jax_step_time.json", {"machine": machine, "rows": rows}
    )
    harness.write_csv(workdir, "jax_step_time.csv", rows, COLUMNS)
    return rows
