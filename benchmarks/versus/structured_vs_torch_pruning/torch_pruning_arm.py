"""The Torch-Pruning arm of `benchmarks.structured_vs_torch_pruning`.

Needs `torch` and `torch-pruning` (the `structured-peer` extra). For each
seed: train the PyTorch network (`torch_models`) dense for `budget.epochs`;
then, from a copy of it for each fraction, prune with Torch-Pruning's
`MetaPruner` (DepGraph) and `MagnitudeImportance(p=...)` (local pruning:
each coupled group keeps `structured_widths.pruned_width` of its units,
rounded to `round_to`; the logits are left whole), in `budget.prune_steps`
steps at `structured_train.pruning_steps`, training on, then fine-tune. A
fraction of 0 trains the copy on without pruning (the dense model with the
same total budget). Each run records the parameters and MACs
(`tp.utils.count_ops_and_params`, one example), the test accuracy, the time
the pruning takes (building the pruner, its DepGraph, and its steps), and
the median step time of each phase; the latency of the seed-0 models,
shrunk against dense, is measured once per architecture (it depends only on
the shapes, which every seed shares).
"""

import copy
import time

import numpy as np
import torch
import torch_pruning as tp

from benchmarks.structured_vs_torch_pruning import torch_models, torch_train
from experiments.common import latency
from experiments.common.structured import train as structured_train
from experiments.common.structured import widths as structured_widths

__all__ = ["run_arm"]


def _costs(model, features):
    macs, params = tp.utils.count_ops_and_params(model, torch.zeros(1, features))
    return int(params), int(macs)


def _shapes(model):
    return {name: tuple(value.shape) for name, value in model.state_dict().items()}


def _prune_and_finetune(dense, optimizer_state, data, budget, seed, fraction, settings):
    """Prunes a copy of the trained `dense` to `fraction`, fine-tunes it: `(model, record)`.

    The copy's optimizer goes on from the dense run's `optimizer_state`, until
    the first pruning step makes it anew.
    """
    model = copy.deepcopy(dense)
    per_epoch = structured_train.steps_per_epoch(len(data.x_train), budget)
    trainer = torch_train.Trainer(
        model, data, budget, seed, step=budget.epochs * per_epoch
    )
    trainer.optimizer.load_state_dict(copy.deepcopy(optimizer_state))
    record = {"setup_seconds": 0.0, "step_seconds": []}
    before_step = None
    if fraction:
        model.eval()  # The DepGraph's forward must not move batch norm's statistics.
        example = torch.from_numpy(np.ascontiguousarray(data.x_train[:2]))
        start = time.perf_counter()
        pruner = tp.pruner.MetaPruner(
            model,
            example,
            importance=tp.importance.MagnitudeImportance(p=settings.importance_p),
            pruning_ratio=fraction,
            iterative_steps=budget.prune_steps,
            round_to=settings.round_to,
            ignored_layers=[model.logits],
        )
        record["setup_seconds"] = time.perf_counter() - start
        steps = set(structured_train.pruning_steps(len(data.x_train), budget))

        def before_step(step):
            if step in steps:
                start = time.perf_counter()
                pruner.step()
                record["step_seconds"].append(time.perf_counter() - start)
                trainer.reset_optimizer()

    trainer.fit(budget.epochs, budget.total_epochs, before_step)
    # The steps of this fit: the pruning epochs', then the fine-tuning ones'.
    pruning = budget.prune_epochs * per_epoch
    seconds = trainer.step_seconds
    record["prune_phase_step_ms"] = 1e3 * float(np.median(seconds[:pruning]))
    record["finetune_step_ms"] = (
        1e3 * float(np.median(seconds[pruning:])) if seconds[pruning:] else None
    )
    return model, record


def run_arm(arch, data, fractions, budget, seeds, settings):
    """Runs the Torch-Pruning arm on one architecture and data set.

    Args:
      arch: a `structured_models` architecture (dense).
      data: an `experiments.common.datasets.Split`.
      fractions: fractions of units pruned (0 for the unpruned reference).
      budget: a `structured_train.Budget`.
      seeds: seeds; each trains its own dense model.
      settings: what else the arms share (`structured_lib.Config`):
        `importance_p`, `round_to`, `torch_path`, `latency_batches`,
        `latency_rounds`, `round_seconds`.

    Returns:
      `(runs, latency_rows)`: a record per (seed, fraction), and
      `latency.compare`'s rows for the first seed's models: "dense" (as
      trained before pruning) and each fraction above 0, as a string.
    """
    runs, timed = [], {}
    dense_costs = _costs(torch_models.torch_model(arch), arch.features)
    for seed in seeds:
        torch.manual_seed(seed)
        dense = torch_models.torch_model(arch, seed=seed)
        trainer = torch_train.Trainer(dense, data, budget, seed)
        trainer.fit(0, budget.epochs)
        dense_step_ms = 1e3 * float(np.median(trainer.step_seconds))
        dense_accuracy = torch_train.evaluate(dense, data.x_test, data.y_test)
        if seed == seeds[0]:
            timed["dense"] = dense
        for fraction in fractions:
            model, record = _prune_and_finetune(
                dense,
                trainer.optimizer.state_dict(),
                data,
                budget,
                seed,
                fraction,
                settings,
            )
            params, macs = _costs(model, arch.features)
            expected = arch
            if fraction:
                expected = structured_widths.shrunk(arch, fraction, settings.round_to)
            record.update(
                framework="torch",
                seed=seed,
                fraction=fraction,
                params=params,
                macs=macs,
                dense_params=dense_costs[0],
                dense_macs=dense_costs[1],
                dense_accuracy=dense_accuracy,
                test_accuracy=torch_train.evaluate(model, data.x_test, data.y_test),
                dense_step_ms=dense_step_ms,
                prune_seconds=record["setup_seconds"] + sum(record["step_seconds"]),
                follows_width_rule=_shapes(model)
                == _shapes(torch_models.torch_model(expected)),
            )
            runs.append(record)
            if seed == seeds[0] and fraction:
                timed[str(fraction)] = model
    latency_rows = latency.compare(
        timed,
        lambda model, batch: torch_models.torch_inference(
            model, batch, settings.torch_path
        ),
        settings.latency_batches,
        settings.latency_rounds,
        settings.round_seconds,
    )
    return runs, latency_rows
