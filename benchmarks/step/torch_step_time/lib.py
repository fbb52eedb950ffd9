"""Step time of `MaskedModel` against stock `keras.Model` on Keras's PyTorch backend.

Contenders side by side in one process, as `benchmarks.jax_step_time` runs
them on JAX: for each model (the 4x1024 MLP of `benchmarks.step_time`, a
small keras_hub BERT), stock Keras and the same model with an `OutputMask`
(every other unit of each Dense layer frozen) or a 90% `ElementMask` (on the
kernel of every Dense and EinsumDense layer), each run eagerly by Keras's
torch trainer (`jit_compile=False`: `torch.compile` takes minutes per model
here). Each is timed through its own `train_function` on one fixed batch,
round-robin (`benchmarks.harness.round_robin`), and reported as the median
of per-round ratios to stock, of wall time and of the process's CPU time.
"""

import dataclasses

import keras
import numpy as np

import maskfit
from benchmarks import harness
from benchmarks.jax_step_time import lib as jax_step_time
from benchmarks.step_time import lib as step_time

COLUMNS = ("model", "mask", *harness.RATIO_COLUMNS)
_STEP_TIME = step_time.Config()


@dataclasses.dataclass
class Config(harness.TimingConfig, steps_per_execution=1):
    """What to measure; the sizes default to `benchmarks.step_time`'s.

    The timing fields and `seed` of `harness.TimingConfig` (Keras's torch
    trainer runs one step per call: `steps_per_execution` must be 1), and:

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
    bert_layers: int = _STEP_TIME.bert_layers
    bert_hidden: int = _STEP_TIME.bert_hidden
    bert_heads: int = _STEP_TIME.bert_heads
    bert_intermediate: int = _STEP_TIME.bert_intermediate
    bert_vocabulary: int = _STEP_TIME.bert_vocabulary
    bert_sequence: int = _STEP_TIME.bert_sequence
    bert_batch: int = _STEP_TIME.bert_batch
    sparsity: float = _STEP_TIME.sparsity


class _Timed(harness.Timed):
    """One model stepped by its own `train_function`, as Keras's torch `fit` calls it."""

    def prepare(self, x, y, steps_per_execution):
        del steps_per_execution  # one step per call on torch
        self.model.fit(x, y, batch_size=len(y), epochs=1, shuffle=False, verbose=0)
        batch = keras.tree.map_structure(keras.ops.convert_to_tensor, (x, y))
        return [batch]

    def call(self):
        return self.model.train_function(self.iterator)


def _contender(config, model_name, mask):
    keras.utils.set_random_seed(config.seed)
    model_class = keras.Model if mask == "none" else maskfit.MaskedModel
    rng = np.random.default_rng(config.seed)
    if model_name == "bert":
        model, (x, y) = step_time.bert(config, model_class, rng)
    else:
        model, x, y = jax_step_time._mlp(config, model_class, rng)
    step_time.set_masks(model, mask, config.sparsity, config.seed)
    model.compile(
        optimizer=harness.optimizer(config.optimizer),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
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
        harness.log_ratio_row(" ".join(contender.key), row)
        rows.append(row)
    return rows


def format_table(rows):
    """Returns `rows` as a fixed-width text table, one line per contender."""
    lines = [f"{'model':5} {'mask':7} {harness.RATIO_HEADER}"]
    for row in rows:
        lines.append(f"{row['model']:5} {row['mask']:7} {harness.ratio_cells(row)}")
    return "\n".join(lines)


def run(config, workdir):
    """Times every model's contenders; writes `torch_step_time.{json,csv}` to `workdir`.

    Args:
      config: a `Config`.
      workdir: a directory; created if missing.

    Returns:
      The rows of the table, as dicts with the keys in `COLUMNS`.

    Raises:
      RuntimeError: when Keras does not run on torch in this process.
      ValueError: for `steps_per_execution` other than 1.
    """
    if keras.backend.backend() != "torch":
        raise RuntimeError(
            "benchmarks.torch_step_time measures Keras's torch backend, but this"
            f" process runs Keras on '{keras.backend.backend()}'. Run it as"
            " `python -m benchmarks.torch_step_time` (which selects torch) or set"
            " KERAS_BACKEND=torch before Keras is imported."
        )
    if config.steps_per_execution != 1:
        raise ValueError(
            "benchmarks.torch_step_time: Keras's torch trainer runs one step per"
            f" call; received steps_per_execution={config.steps_per_execution}."
            " Pass --steps_per_execution=1."
        )
    harness.write_config(workdir, config)
    rows = []
    for model_name in config.models:
        rows.extend(_measure(config, model_name))
    import torch

    machine = dict(harness.machine(), backend="torch", torch=torch.__version__)
    harness.write_json(
        workdir, "torch_step_time.json", {"machine": machine, "rows": rows}
    )
    harness.write_csv(workdir, "torch_step_time.csv", rows, COLUMNS)
    return rows
