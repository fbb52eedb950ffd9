"""Step time and memory of `MaskedModel.fit` against stock `keras.Model.fit`.

Beside the times, each contender compiled with XLA (`jit` mode) reports what
XLA makes of its step (`benchmarks.hlo`): the optimized HLO's fusions,
kernels and bytes accessed, and their ratios to stock's, so the cost of the
masking shows without the accelerator it would run on. `timing=False`
reports those alone, for sizes too slow to time here (BERT-base).
"""

import dataclasses

import keras
import numpy as np
import tensorflow as tf

import maskfit
import maskfit.pruning as pruning
from benchmarks import harness, hlo
from maskfit import internals
from maskfit import model as model_lib
from maskfit.optim import traits
from maskfit.step import plan as plan_lib

COLUMNS = (
    "model",
    "mode",
    "optimizer",
    "mask",
    *harness.RATIO_COLUMNS,
    "param_bytes",
    "mask_state_bytes",
    "snapshot_bytes",
    *hlo.COLUMNS,
)


@dataclasses.dataclass
class Config(harness.TimingConfig):
    """What to measure; the defaults are the sizes of issue #7.

    The timing fields and `seed` of `harness.TimingConfig`, and:

    Attributes:
      models: Models: mlp, cnn, bert.
      modes: Modes: graph, jit.
      optimizers: adamw, sgd.
      masks: Mask kinds: none, output, element, pruning (`set_masks`).
      mlp_depth: Hidden Dense layers of the MLP.
      mlp_width: Units per MLP layer.
      mlp_batch: MLP batch size.
      cnn_filters: Conv filters.
      cnn_image: CNN input height and width.
      cnn_batch: CNN batch size.
      bert_layers: Transformer layers of the BERT (keras_hub's BertBackbone).
      bert_hidden: Its hidden size.
      bert_heads: Its attention heads.
      bert_intermediate: Its feed-forward size.
      bert_vocabulary: Its vocabulary.
      bert_sequence: Tokens per example.
      bert_batch: BERT batch size.
      classes: Classes of the data.
      sparsity: Frozen share under ElementMask.
      hlo: Report the XLA-compiled steps' fusions, kernels and bytes accessed.
      timing: Time the steps (False: the HLO figures alone).
    """

    models: tuple = ("mlp", "cnn")
    modes: tuple = ("graph", "jit")
    optimizers: tuple = ("adamw", "sgd")
    masks: tuple = ("none", "output", "element")
    mlp_depth: int = 4
    mlp_width: int = 1024
    mlp_batch: int = 256
    cnn_filters: tuple = (32, 64, 128)
    cnn_image: int = 32
    cnn_batch: int = 128
    bert_layers: int = 2
    bert_hidden: int = 128
    bert_heads: int = 2
    bert_intermediate: int = 512
    bert_vocabulary: int = 5000
    bert_sequence: int = 128
    bert_batch: int = 32
    classes: int = 10
    sparsity: float = 0.9
    hlo: bool = True
    timing: bool = True


def bert(config, model_class, rng):
    """A keras_hub `BertBackbone` of `config`'s `bert_*` sizes under a classifier.

    Returns `(model, (x, y))`: one batch of random tokens and labels.
    """
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
    return model, (x, rng.integers(0, 2, size=(config.bert_batch,)).astype(np.int32))


def set_masks(model, mask, sparsity, seed):
    """Declares `mask` on `model`'s layers, nested ones too.

    `"output"`: every other unit of each Dense and convolution frozen;
    `"element"`: a random `sparsity` share of the kernel of each Dense,
    EinsumDense and convolution frozen; `"pruning"`: magnitude pruning of
    the kernels of those layers at `sparsity` at the first step (TF-MOT counts
    it as step 1), its next update a million steps away (`PRUNING_FREQUENCY`),
    so that the timed steps are those of a rule between its updates (what
    every step of a pruning run but its update steps costs); `"none"`: nothing.
    """
    if mask == "pruning":
        pruning.prune_low_magnitude(
            [
                layer
                for layer in internals.sublayers(model)
                if isinstance(
                    layer, (keras.layers.Dense, keras.layers.EinsumDense, _CONV)
                )
            ],
            pruning.ConstantSparsity(
                sparsity, begin_step=1, frequency=PRUNING_FREQUENCY
            ),
        )
        return
    rng = np.random.default_rng(seed + 1)
    for layer in internals.sublayers(model):
        kernel = getattr(layer, "kernel", None)
        if not layer.trainable_weights or kernel is None:
            continue
        if mask == "output" and isinstance(layer, (keras.layers.Dense, _CONV)):
            units = kernel.shape[-1]
            maskfit.set_mask(layer, maskfit.OutputMask(np.arange(units) % 2))
        elif mask == "element" and isinstance(
            layer, (keras.layers.Dense, keras.layers.EinsumDense, _CONV)
        ):
            keep = rng.random(tuple(kernel.shape)) >= sparsity
            maskfit.set_mask(layer, maskfit.ElementMask({"kernel": keep}))


_CONV = keras.layers.Conv2D

# The "pruning" contender's steps between updates.
PRUNING_FREQUENCY = 1_000_000


def _build(config, model_name, masked):
    """Returns `(model, (x, y))` for one contender."""
    model_class = maskfit.MaskedModel if masked else keras.Model
    rng = np.random.default_rng(config.seed)
    if model_name == "bert":
        return bert(config, model_class, rng)
    if model_name == "mlp":
        inputs = keras.Input((config.mlp_width,))
        hidden = inputs
        for _ in range(config.mlp_depth):
            hidden = keras.layers.Dense(config.mlp_width, activation="relu")(hidden)
        batch, shape = config.mlp_batch, (config.mlp_width,)
    elif model_name == "cnn":
        shape = (config.cnn_image, config.cnn_image, 3)
        inputs = keras.Input(shape)
        hidden = inputs
        for filters in config.cnn_filters:
            hidden = keras.layers.Conv2D(filters, 3, padding="same", activation="relu")(
                hidden
            )
            hidden = keras.layers.MaxPooling2D()(hidden)
        hidden = keras.layers.GlobalAveragePooling2D()(hidden)
        batch = config.cnn_batch
    else:
        raise ValueError(
            f"Unknown model {model_name!r}; expected 'mlp', 'cnn' or 'bert'."
        )
    outputs = keras.layers.Dense(config.classes)(hidden)
    model = model_class(inputs, outputs)
    x = rng.standard_normal((batch,) + shape).astype(np.float32)
    y = rng.integers(0, config.classes, size=(batch,)).astype(np.int32)
    return model, (x, y)


def _nbytes(variable):
    return int(np.prod(variable.shape)) * tf.as_dtype(variable.dtype).size


def _memory(model):
    """Returns `(param, mask state, snapshot)` bytes of `model` after its first fit."""
    variables = model_lib.all_trainable_variables(model)
    params = sum(_nbytes(v) for v in variables)
    masker = model_lib.masker_of(model)
    if masker is None:
        return params, 0, 0
    guarded = [
        variables[i]
        for i in masker.masked_indices
        if i not in masker.plan.frozen
        and masker.plan.guarded[i] != plan_lib.NEVER
        and traits.moves_zero_gradient_entries(model.optimizer, variables[i])
    ]
    return params, masker.state_bytes(), sum(_nbytes(v) for v in guarded)


def _contender(config, model_name, mode, optimizer, mask):
    keras.utils.set_random_seed(config.seed)
    model, (x, y) = _build(config, model_name, masked=mask != "none")
    set_masks(model, mask, config.sparsity, config.seed)
    model.compile(
        optimizer=harness.optimizer(optimizer),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        jit_compile=mode == "jit",
        steps_per_execution=config.steps_per_execution,
    )
    key = (model_name, mode, optimizer, mask)
    if config.timing:
        contender = harness.Timed.of_config(key, model, x, y, config)
    else:
        contender = hlo.Untimed(key, model)
    # After `fit` built the step: what XLA makes of the same step.
    contender.counts = (
        hlo.tf_step(model, x, y) if config.hlo and mode == "jit" else None
    )
    contender.memory = _memory(model)
    return contender


def _measure(config, model_name, mode):
    """Times every contender of one (model, mode), round-robin; returns rows."""
    masks = ("none",) + tuple(m for m in config.masks if m != "none")
    contenders = [
        _contender(config, model_name, mode, optimizer, mask)
        for optimizer in config.optimizers
        for mask in masks
    ]
    if config.timing:
        times, cpu_times = harness.round_robin(contenders, config.repeats)
    counts = {c.key: c.counts for c in contenders}
    rows = []
    for contender in contenders:
        _, _, optimizer, mask = contender.key
        stock = (model_name, mode, optimizer, "none")
        params, state, snapshot = contender.memory
        timing = (
            harness.ratio_row(times, cpu_times, contender.key, stock)
            if config.timing
            else dict.fromkeys(harness.RATIO_COLUMNS)
        )
        rows.append(
            {
                "model": model_name,
                "mode": mode,
                "optimizer": optimizer,
                "mask": mask,
                **timing,
                "param_bytes": params,
                "mask_state_bytes": state,
                "snapshot_bytes": snapshot,
                **hlo.row(counts[contender.key], counts[stock]),
            }
        )
        if config.timing:
            harness.log_ratio_row(" ".join(contender.key), rows[-1])
        hlo.log_row(" ".join(contender.key), rows[-1])
    return rows


def format_table(rows):
    """Returns `rows` as a fixed-width text table, one line per contender."""
    lines = [
        f"{'model':5} {'mode':5} {'optimizer':9} {'mask':7} {harness.RATIO_HEADER}"
        f" {'mask state':>10} {'snapshot':>8} {hlo.HEADER}"
    ]
    for row in rows:
        state = row["mask_state_bytes"] / row["param_bytes"]
        snapshot = row["snapshot_bytes"] / row["param_bytes"]
        lines.append(
            f"{row['model']:5} {row['mode']:5} {row['optimizer']:9} {row['mask']:7}"
            f" {harness.ratio_cells(row)} {state:10.2%} {snapshot:8.2%}"
            f" {hlo.cells(row)}"
        )
    return "\n".join(lines)


def run(config, workdir):
    """Measures every configuration and writes `step_time.{json,csv}` to `workdir`.

    Contenders of one (model, mode) are built and warmed up once, then timed
    round-robin for `config.repeats` rounds of `config.steps` steps each. A
    contender's ratio is taken per round against the stock model with the same
    optimizer, so a slow patch of the machine hits both; the rows report the
    median ratio and its range over rounds, and the median ratio of the
    process's CPU time, which other processes on a shared machine sway less.

    Args:
      config: a `Config`.
      workdir: a directory; created if missing.

    Returns:
      The rows of the table, as dicts with the keys in `COLUMNS`.
    """
    harness.write_config(workdir, config)
    rows = []
    for model_name in config.models:
        for mode in config.modes:
            rows.extend(_measure(config, model_name, mode))
    harness.write_json(
        workdir, "step_time.json", {"machine": harness.machine(), "rows": rows}
    )
    harness.write_csv(workdir, "step_time.csv", rows, COLUMNS)
    return rows
