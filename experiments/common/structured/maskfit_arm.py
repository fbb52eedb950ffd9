"""maskfit's structured pruning on issue 23's networks: train, prune gradually, shrink.

The maskfit arm of `benchmarks.structured_vs_torch_pruning` (named in
`benchmarks.structured_vs_torch_pruning.lib.ARMS`) and the runs of
`experiments.structured_pruning`. Per seed, the network of
`experiments.common.structured.models` is a `maskfit.MaskedModel` with that seed's
initial weights; it trains dense on the budget's batches
(`structured_train`); then for each fraction a copy of it (weights and the
optimizer's state, so training goes on as one run, as the Torch-Pruning arm's
copies do) gets `maskfit.pruning.prune_units` with
`MagnitudeImportance(p=settings.importance_p)`, `round_to` and a
`structured_schedule.budget_schedule` (the same steps and fractions as
Torch-Pruning's `iterative_steps`), trains through the pruning epochs and
fine-tunes, and `maskfit.pruning.shrink` cuts the removed units out. A
fraction of 0 trains the copy on without pruning.

Unlike Torch-Pruning, which cuts units out at each step and makes a new
optimizer, the masked model keeps its dense shapes until `shrink` and its
optimizer's state for the units that stay.
"""

import time

import keras
import numpy as np

import maskfit
from experiments.common import latency, model_cost, training
from experiments.common.structured import models as structured_models
from experiments.common.structured import schedule as structured_schedule
from experiments.common.structured import train as structured_train
from experiments.common.structured import widths as structured_widths

__all__ = ["run_arm", "shapes"]


def _fit_steps(model, data, order, callback):
    """Trains `model` on the batches `order` (steps x batch) in one `fit`."""
    indices = order.ravel()
    model.fit(
        data.x_train[indices],
        data.y_train[indices],
        batch_size=order.shape[1],
        epochs=1,
        shuffle=False,
        verbose=0,
        callbacks=[callback],
    )


def shapes(model):
    """`{layer name: [weight shapes]}` of a model's layers that have weights."""
    return {
        layer.name: [tuple(w.shape) for w in layer.weights]
        for layer in model.layers
        if layer.weights
    }


def _plain(model, arch):
    """A stock Keras copy of a trained (masked) network, for timing and counting."""
    plain = structured_models.keras_model(arch)
    plain.set_weights(model.get_weights())
    return plain


def _compile(model, budget, settings):
    structured_train.compile_keras(model, budget, jit_compile=settings.jit_compile)
    # Eager steps skip tracing, which is most of a tiny run's time (tests).
    model.run_eagerly = bool(getattr(settings, "run_eagerly", False))


def _copy_of(arch, state, budget, settings, schedule):
    """A new masked network at `state` (weights, optimizer variables), pruned on `schedule`.

    Returns `(model, seconds prune_units took)`.
    """
    weights, optimizer_values = state
    model = structured_models.keras_model(arch, model_class=maskfit.MaskedModel)
    model.set_weights(weights)
    seconds = 0.0
    if schedule is not None:
        start = time.perf_counter()
        model = maskfit.pruning.prune_units(
            model,
            schedule,
            importance=maskfit.pruning.MagnitudeImportance(p=settings.importance_p),
            round_to=settings.round_to,
        )
        seconds = time.perf_counter() - start
    _compile(model, budget, settings)
    model.optimizer.build(model.trainable_variables)
    variables = model.optimizer.variables
    if [tuple(v.shape) for v in variables] != [v.shape for v in optimizer_values]:
        raise RuntimeError(
            "The copy's optimizer does not have the dense run's variables."
        )
    for variable, value in zip(variables, optimizer_values):
        variable.assign(value)
    return model, seconds


def _prune_and_finetune(arch, state, data, order, budget, fraction, settings):
    """Trains a copy at `state` on `order`, pruning to `fraction`: `(shrunk, record)`."""
    examples = len(data.x_train)
    schedule = None
    if fraction:
        schedule = structured_schedule.budget_schedule(examples, budget, fraction)
    model, setup_seconds = _copy_of(arch, state, budget, settings, schedule)
    timer = training.StepTimes()  # the benchmark's only per-step work
    _fit_steps(model, data, order, timer)
    # order[0] is the last dense step (it traces the step function); then the
    # pruning epochs, then the fine-tuning ones.
    seconds = np.asarray(timer.seconds[1:])
    per_epoch = structured_train.steps_per_epoch(examples, budget)
    pruning = budget.prune_epochs * per_epoch
    first = budget.epochs * per_epoch
    at = [s - first for s in structured_train.pruning_steps(examples, budget)]
    others = np.delete(seconds[:pruning], at)
    typical = float(np.median(others)) if len(others) else 0.0
    record = {
        "setup_seconds": setup_seconds,
        "step_seconds": [float(seconds[i]) for i in at] if fraction else [],
        "prune_phase_step_ms": 1e3 * float(np.median(seconds[:pruning])),
        "finetune_step_ms": (
            1e3 * float(np.median(seconds[pruning:]))
            if len(seconds) > pruning
            else None
        ),
    }
    # The update steps' extra time over a typical step of the same phase.
    extra = sum(max(0.0, s - typical) for s in record["step_seconds"])
    record["prune_seconds"] = setup_seconds + extra
    if fraction:
        start = time.perf_counter()
        small = maskfit.pruning.shrink(model)
        record["shrink_seconds"] = time.perf_counter() - start
    else:
        small = _plain(model, arch)
    masked = model.predict(data.x_test, batch_size=512, verbose=0)
    record["shrunk_max_abs_difference"] = float(
        np.max(np.abs(small.predict(data.x_test, batch_size=512, verbose=0) - masked))
    )
    record["masked_accuracy"] = float(np.mean(np.argmax(masked, -1) == data.y_test))
    return small, record


def run_arm(arch, data, fractions, budget, seeds, settings):
    """Runs maskfit's structured pruning on one architecture and data set.

    The signature and records are `benchmarks.torch_pruning_arm.run_arm`'s.

    Args:
      arch: a `structured_models` architecture (dense).
      data: an `experiments.common.datasets.Split`.
      fractions: fractions of units pruned (0 for the unpruned reference).
      budget: a `structured_train.Budget`.
      seeds: seeds; each trains its own dense model.
      settings: `importance_p`, `round_to`, `jit_compile`, `keras_path`,
        `latency_batches`, `latency_rounds`, `round_seconds` (a
        `benchmarks.structured_vs_torch_pruning.lib.Config` or the experiment's config).

    Returns:
      `(runs, latency_rows)`: a record per (seed, fraction), with the shrunk
      model's costs (`model_cost.count`) and test accuracy, and
      `latency.compare`'s rows for the first seed's stock Keras models:
      "dense" (as trained before pruning) and each fraction above 0, shrunk.

    Example (tiny):

    >>> import types
    >>> from experiments.common import datasets
    >>> data = datasets.load("digits")
    >>> settings = types.SimpleNamespace(importance_p=2, round_to=8,
    ...     jit_compile=False, keras_path="function", latency_batches=(1,),
    ...     latency_rounds=1, round_seconds=0.001)
    >>> budget = structured_train.Budget(epochs=1, prune_epochs=1, prune_steps=2,
    ...                                  finetune_epochs=0)
    >>> runs, rows = run_arm(structured_models.MLP(64, hidden=(16,)), data, (0.5,),
    ...                      budget, (0,), settings)
    >>> runs[0]["params"], runs[0]["follows_width_rule"]
    (610, True)
    """
    runs, timed = [], {}
    dense_params, dense_macs = model_cost.count(structured_models.keras_model(arch))
    examples = len(data.x_train)
    dense_steps = budget.epochs * structured_train.steps_per_epoch(examples, budget)
    for seed in seeds:
        keras.utils.set_random_seed(seed)
        order = structured_train.batches(examples, budget, seed, 0, budget.total_epochs)
        dense = structured_models.keras_model(
            arch, seed=seed, model_class=maskfit.MaskedModel
        )
        _compile(dense, budget, settings)
        timer = training.StepTimes()
        if dense_steps > 1:
            _fit_steps(dense, data, order[: dense_steps - 1], timer)
        # The state before the last dense step: each fraction's copy starts
        # there, so its first step (which traces) is not a pruning step.
        state = (dense.get_weights(), [v.numpy() for v in dense.optimizer.variables])
        _fit_steps(dense, data, order[dense_steps - 1 : dense_steps], timer)
        dense_accuracy = structured_train.evaluate_keras(
            dense, data.x_test, data.y_test
        )
        dense_step_ms = 1e3 * float(np.median(timer.seconds[1:] or timer.seconds))
        if seed == seeds[0]:
            timed["dense"] = _plain(dense, arch)
        for fraction in fractions:
            small, record = _prune_and_finetune(
                arch, state, data, order[dense_steps - 1 :], budget, fraction, settings
            )
            params, macs = model_cost.count(small)
            expected = arch
            if fraction:
                expected = structured_widths.shrunk(arch, fraction, settings.round_to)
            record.update(
                framework="maskfit",
                seed=seed,
                fraction=fraction,
                params=params,
                macs=macs,
                dense_params=dense_params,
                dense_macs=dense_macs,
                dense_accuracy=dense_accuracy,
                test_accuracy=structured_train.evaluate_keras(
                    small, data.x_test, data.y_test
                ),
                dense_step_ms=dense_step_ms,
                follows_width_rule=shapes(small)
                == shapes(structured_models.keras_model(expected)),
            )
            runs.append(record)
            if seed == seeds[0] and fraction:
                timed[str(fraction)] = small
    latency_rows = latency.compare(
        timed,
        lambda model, batch: latency.keras_inference(model, batch, settings.keras_path),
        settings.latency_batches,
        settings.latency_rounds,
        settings.round_seconds,
    )
    return runs, latency_rows
