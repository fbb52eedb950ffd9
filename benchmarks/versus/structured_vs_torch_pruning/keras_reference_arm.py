"""The Keras reference arm of `benchmarks.structured_vs_torch_pruning`: no pruning.

Trains the Keras network of `experiments.common.structured.models` dense on the
whole budget (`budget.total_epochs`, the batches and optimizer every arm
uses), per seed, and records its parameters and MACs
(`experiments.common.model_cost`) and test accuracy as fraction 0. For latency it
times the trained seed-0 model against Keras models of the shrunk shapes
(`structured_widths.shrunk`, the widths Torch-Pruning leaves at each
fraction): a pruned-and-shrunk Keras model of those shapes runs the same
kernels, so these ratios are what any Keras pruning that follows the same
width rule gets at inference.
"""

import keras

from experiments.common import latency, model_cost
from experiments.common.structured import models as structured_models
from experiments.common.structured import train as structured_train
from experiments.common.structured import widths as structured_widths

__all__ = ["run_arm"]


def run_arm(arch, data, fractions, budget, seeds, settings):
    """Runs the reference arm; the signature and records are `torch_pruning_arm.run_arm`'s.

    Only fraction 0 gets accuracy records (nothing is pruned); every
    fraction gets a latency contender.
    """
    runs, timed = [], {}
    dense_params, dense_macs = model_cost.count(structured_models.keras_model(arch))
    for seed in seeds:
        keras.utils.set_random_seed(seed)
        model = structured_models.keras_model(arch, seed=seed)
        structured_train.compile_keras(model, budget, jit_compile=settings.jit_compile)
        structured_train.keras_fit(model, data, budget, seed, 0, budget.epochs)
        dense_accuracy = structured_train.evaluate_keras(
            model, data.x_test, data.y_test
        )
        structured_train.keras_fit(
            model, data, budget, seed, budget.epochs, budget.total_epochs
        )
        runs.append(
            {
                "framework": "keras",
                "seed": seed,
                "fraction": 0.0,
                "params": dense_params,
                "macs": dense_macs,
                "dense_params": dense_params,
                "dense_macs": dense_macs,
                "dense_accuracy": dense_accuracy,
                "test_accuracy": structured_train.evaluate_keras(
                    model, data.x_test, data.y_test
                ),
                "follows_width_rule": True,
            }
        )
        if seed == seeds[0]:
            timed["dense"] = model
    for fraction in fractions:
        if fraction:
            shrunk = structured_widths.shrunk(arch, fraction, settings.round_to)
            timed[str(fraction)] = structured_models.keras_model(shrunk, seed=0)
    latency_rows = latency.compare(
        timed,
        lambda model, batch: latency.keras_inference(model, batch, settings.keras_path),
        settings.latency_batches,
        settings.latency_rounds,
        settings.round_seconds,
    )
    return runs, latency_rows
