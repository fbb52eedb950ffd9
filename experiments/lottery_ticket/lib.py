"""The lottery ticket experiment as a library: `Config` and `run(config, workdir)`.

Iterative magnitude pruning with rewinding, as Frankle & Carbin (ICLR 2019)
ran it on LeNet-300-100 and Frankle et al. (ICML 2020) extended it with
rewinding to an early step. For each seed: train the dense network; then, each
round, prune per layer the still-alive kernel weights of smallest magnitude,
rewind the survivors to their values after `rewind_step` steps of the dense
run, and train again. Pruned weights are held at exactly 0 by
`maskfit.ElementMask`s on the kernels (biases are not pruned). Two controls
train each round with their own numbers: "reinit" (the ticket's masks, fresh
random weights) and "random" (random masks at the ticket's per-layer counts,
nested round to round, the rewound weights).

Every training reports the paper's two metrics: the early-stopping iteration
(the step of minimum validation loss, evaluated every `eval_every` steps) and
the test accuracy at that step. The data is scikit-learn's bundled digits
(8x8 images, 10 classes; the paper used MNIST).
"""

import dataclasses
import math
import os
import time

import numpy as np
import tensorflow as tf
from absl import logging

from experiments import common
from experiments.common import training
from experiments.lottery_ticket import report, train
from maskfit import pruning

__all__ = ["ARMS", "Config", "run"]

# The pruned network ("ticket") and the paper's two controls.
ARMS = ("ticket", "reinit", "random")


@dataclasses.dataclass(frozen=True)
class Config:
    """One run; the defaults are the paper's LeNet-300-100 set-up, scaled to digits.

    Each of `seeds` runs the whole experiment once: the dense training, then
    `rounds` rounds of pruning, each trained three times (ticket, reinit,
    random). A round prunes `prune_rate` of the surviving kernel weights of
    each hidden layer and `prune_rate / 2` of the output layer's, as the
    paper did. Every training runs `train_steps` steps of `batch_size`
    examples and evaluates every `eval_every` steps; the compiled step runs
    `gcd(eval_every, rewind_step)` steps per call, so that the evaluations and
    the rewind snapshot fall between calls (the updates are the same).

    Attributes:
      hidden_units: Units of each hidden layer (the paper's LeNet-300-100: 300,100).
      optimizer: A keras.optimizers name, in any case (`common.OPTIMIZERS`).
      learning_rate: Learning rate.
      batch_size: Examples per step.
      train_steps: Steps of each training.
      eval_every: Steps between evaluations (validation loss for early stopping, test
        accuracy).
      rounds: Rounds of pruning after the dense run.
      prune_rate: Fraction of each hidden layer's surviving weights pruned per round;
        the output layer prunes half this fraction.
      rewind_step: Survivors go back to their values after this many steps of the dense
        run (0: the original initialisation).
      seeds: Seeds; each runs every round.
      validation_fraction: Fraction of the data held out for early stopping.
      test_fraction: Fraction of the data held out to test.
      jit_compile: Compile the step with XLA.
    """

    hidden_units: tuple = (300, 100)
    optimizer: str = "adam"
    learning_rate: float = 1.2e-3
    batch_size: int = 60
    train_steps: int = 1500
    eval_every: int = 20
    rounds: int = 10
    prune_rate: float = 0.2
    rewind_step: int = 0
    seeds: tuple = (0, 1, 2)
    validation_fraction: float = 0.15
    test_fraction: float = 0.2
    jit_compile: bool = False

    def __post_init__(self):
        for name in ("hidden_units", "seeds"):
            value = getattr(self, name)
            if isinstance(value, list):
                object.__setattr__(self, name, tuple(value))
        for name in ("batch_size", "train_steps", "eval_every", "rounds"):
            common.check_int(name, getattr(self, name), minimum=1)
        common.check_int("rewind_step", self.rewind_step, minimum=0)
        if self.rewind_step >= self.train_steps:
            raise ValueError(
                "Received an invalid value for `rewind_step`, expected a step"
                f" before the end of training (below train_steps={self.train_steps})."
                f" Received: rewind_step={self.rewind_step!r}"
            )
        training.check_int_tuple("hidden_units", self.hidden_units, minimum=1)
        training.check_int_tuple("seeds", self.seeds, minimum=0)
        training.check_distinct_seeds(self.seeds)
        common.check_fraction("learning_rate", self.learning_rate, upper=math.inf)
        common.check_fraction("prune_rate", self.prune_rate)
        common.check_fraction("validation_fraction", self.validation_fraction)
        common.check_fraction("test_fraction", self.test_fraction)
        if self.validation_fraction + self.test_fraction >= 1:
            raise ValueError(
                "Received invalid values for `validation_fraction` and"
                " `test_fraction`, expected a sum below 1 (the rest trains)."
                f" Received: validation_fraction={self.validation_fraction!r},"
                f" test_fraction={self.test_fraction!r}"
            )
        common.check_optimizer(self.optimizer)

    def layer_rate(self, output):
        """The fraction of survivors pruned per round: half for the output layer."""
        return self.prune_rate / 2 if output else self.prune_rate


def _random_mask(alive, keep, rng):
    """Keeps `keep` entries of the 1s of `alive`, drawn uniformly by `rng`."""
    survivors = np.flatnonzero(alive.ravel())
    kept = rng.choice(survivors, size=keep, replace=False)
    mask = np.zeros(alive.size, np.float32)
    mask[kept] = 1
    return mask.reshape(alive.shape)


def _result(recorder, masks, layer_names):
    """The paper's two metrics for one training, and the weights remaining."""
    steps, losses, accuracies = zip(*recorder.curve)
    best = int(np.argmin(losses))
    sizes = [m.size for m in masks]
    kept = [int(np.count_nonzero(m)) for m in masks]
    remaining = {name: k / s for name, k, s in zip(layer_names, kept, sizes)}
    remaining["all"] = sum(kept) / sum(sizes)
    return {
        "early_stop_iteration": steps[best],
        "test_accuracy": accuracies[best],
        "validation_loss": losses[best],
        # The minimum is the last evaluation: the loss may still have been falling.
        "stopped_at_end": best == len(steps) - 1,
        "final_test_accuracy": accuracies[-1],
        "remaining": remaining,
        "curve": [list(point) for point in recorder.curve],
    }


def _run_seed(trainer, config, data, seed, callbacks_for, on_result):
    """Runs every round of every arm for `seed`; returns {arm: [result per round]}."""
    layers = trainer.layers
    names = [l.name for l in layers]
    batches = train.batches(data, config, seed)
    extra = callbacks_for or (lambda seed, round_, arm: [])
    dense = [np.ones(l.kernel.shape, np.float32) for l in layers]

    recorder = trainer.train(
        train.draw_weights(layers, [seed]),
        dense,
        batches,
        extra(seed, 0, "dense"),
        capture_step=config.rewind_step,
    )
    rewound = recorder.captured
    dense_result = _result(recorder, dense, names)
    on_result(seed, 0, "dense", dense_result)
    results = {arm: [dense_result] for arm in ARMS}
    final = [[l.kernel.numpy(), l.bias.numpy()] for l in layers]
    masks = {"ticket": dense, "random": dense}
    for round_ in range(1, config.rounds + 1):
        outputs = [i == len(layers) - 1 for i in range(len(layers))]
        sparsities = [1 - (1 - config.layer_rate(o)) ** round_ for o in outputs]
        # Only the survivors are candidates: the pruned are 0, and stay pruned.
        masks["ticket"] = [
            pruning.magnitude_mask(kernel, s).numpy() * alive
            for (kernel, _), s, alive in zip(final, sparsities, masks["ticket"])
        ]
        rng = np.random.default_rng([seed, round_, 2])
        masks["random"] = [
            _random_mask(alive, int(np.count_nonzero(ticket)), rng)
            for alive, ticket in zip(masks["random"], masks["ticket"])
        ]
        starts = {
            "ticket": (rewound, masks["ticket"]),
            "reinit": (train.draw_weights(layers, [seed, round_, 1]), masks["ticket"]),
            "random": (rewound, masks["random"]),
        }
        for arm, (weights, arm_masks) in starts.items():
            recorder = trainer.train(
                weights, arm_masks, batches, extra(seed, round_, arm)
            )
            result = _result(recorder, arm_masks, names)
            results[arm].append(result)
            on_result(seed, round_, arm, result)
            if arm == "ticket":
                final = [[l.kernel.numpy(), l.bias.numpy()] for l in layers]
    return results


def run(config, workdir, callbacks_for=None):
    """Runs the experiment for every seed, writing everything in `workdir`.

    Args:
      config: a `Config`.
      workdir: directory for `config.json`, `metrics.json`, `table.md`,
        `lottery_ticket.png` (when matplotlib is installed) and TensorBoard
        events under `tensorboard/<arm>`; created if missing.
      callbacks_for: optional `callbacks_for(seed, round, arm)` returning extra
        Keras callbacks for that training (to watch the weights after every
        step, say); `arm` is 'dense' for round 0, else one of `ARMS`.

    Returns:
      The metrics dict also written to `metrics.json`: per seed, per arm, one
      result per round (round 0, the dense network, is shared by the arms),
      the summary over seeds per arm and round, and `wall_seconds`.

    Raises:
      ImportError: if scikit-learn is missing (before anything is written).
    """
    start = time.perf_counter()
    data = train.load_digits(config)
    os.makedirs(workdir, exist_ok=True)
    common.write_json(os.path.join(workdir, "config.json"), dataclasses.asdict(config))
    writers = {
        arm: tf.summary.create_file_writer(os.path.join(workdir, "tensorboard", arm))
        for arm in ARMS
    }

    def on_result(seed, round_, arm, result):
        logging.info(
            "seed %d round %d %s: %.1f%% of weights remain; early stop at step %d,"
            " test accuracy %.4f",
            seed,
            round_,
            arm,
            100 * result["remaining"]["all"],
            result["early_stop_iteration"],
            result["test_accuracy"],
        )
        for arm_ in ARMS if arm == "dense" else (arm,):
            report.write_curve(writers[arm_], seed, round_, result["curve"])

    try:
        trainer = train.Trainer(config, data)
        per_seed = {
            str(seed): _run_seed(trainer, config, data, seed, callbacks_for, on_result)
            for seed in config.seeds
        }
        summary = report.summarize(per_seed, ARMS)
        for arm in ARMS:
            report.write_summary(writers[arm], summary[arm])
    finally:
        for writer in writers.values():
            writer.close()
    metrics = {
        "data": {name: len(x) for name, (x, _) in data.items()},
        "layers": {l.name: list(l.kernel.shape) for l in trainer.layers},
        "seeds": per_seed,
        "summary": summary,
        "wall_seconds": time.perf_counter() - start,
    }
    common.write_json(os.path.join(workdir, "metrics.json"), metrics)
    table = report.table(summary, list(metrics["layers"]))
    with open(os.path.join(workdir, "table.md"), "w") as f:
        f.write(table)
    report.figure(summary, config, os.path.join(workdir, "lottery_ticket.png"))
    logging.info(
        "%d seeds x %d rounds in %.1f s\n%s",
        len(config.seeds),
        config.rounds,
        metrics["wall_seconds"],
        table,
    )
    return metrics
