"""Tests of experiments.lottery_ticket: tiny runs watched step by step, and the CLI.

A callback on every training records the masks in force and the weights at
its start, after every step and at its end; the tests check the experiment's
promises against those records, not against what the run reports of itself.
"""

import dataclasses
import json
import os

import keras
import numpy as np
import pytest

import maskfit
from experiments.lottery_ticket import report as lottery_ticket_report
from experiments.lottery_ticket.lib import ARMS, Config, run
from tests.helpers import experiment_checks as checks

# Every step is its own execution (eval_every=1), so the watcher sees each.
TINY = Config(
    hidden_units=(12, 8),
    train_steps=10,
    eval_every=1,
    rounds=3,
    rewind_step=3,
    seeds=(0, 1),
)


def _weights(layers):
    return [[layer.kernel.numpy(), layer.bias.numpy()] for layer in layers]


class _Watch(keras.callbacks.Callback):
    """Records one training, and checks after every step that pruned weights are 0."""

    def __init__(self, record, rewind_step):
        super().__init__()
        self._record = record
        self._rewind_step = rewind_step

    def on_train_begin(self, logs=None):
        self._layers = [
            layer
            for layer in self.model.layers
            if isinstance(layer, keras.layers.Dense)
        ]
        masks = [maskfit.get_mask(layer).masks["kernel"] for layer in self._layers]
        self._record.update(
            masks=[m.copy() for m in masks], start=_weights(self._layers)
        )
        self._record["steps"] = []

    def on_train_batch_end(self, batch, logs=None):
        step = int(self.model.optimizer.iterations.numpy())
        for layer, mask in zip(self._layers, self._record["masks"]):
            np.testing.assert_array_equal(layer.kernel.numpy()[mask == 0], 0.0)
        self._record["steps"].append(step)
        if step == self._rewind_step:
            self._record["at_rewind"] = _weights(self._layers)

    def on_train_end(self, logs=None):
        self._record["end"] = _weights(self._layers)


def _watched_run(config, workdir):
    records = {}

    def callbacks_for(seed, round_, arm):
        record = records.setdefault((seed, round_, arm), {})
        return [_Watch(record, config.rewind_step)]

    return run(config, workdir, callbacks_for=callbacks_for), records


@pytest.fixture(scope="module", params=[False, True], ids=["graph", "jit"])
def tiny(request, tmp_path_factory):
    config = dataclasses.replace(TINY, jit_compile=request.param)
    workdir = str(tmp_path_factory.mktemp("lottery"))
    metrics, records = _watched_run(config, workdir)
    return config, workdir, metrics, records


def _trainings(config):
    yield 0, "dense"
    for round_ in range(1, config.rounds + 1):
        for arm in ARMS:
            yield round_, arm


def _assert_bits_equal(actual, expected):
    """Bit for bit: also tells +0.0 from -0.0, and would tell NaNs apart."""
    for a, e in zip(actual, expected):
        np.testing.assert_array_equal(a.view(np.uint32), e.view(np.uint32))


def _rewound(weights, masks):
    return [
        [np.where(mask > 0, kernel, np.float32(0)), bias]
        for (kernel, bias), mask in zip(weights, masks)
    ]


def test_pruned_weights_are_zero_after_every_step_of_every_round(tiny):
    config, _, _, records = tiny
    assert len(records) == len(config.seeds) * (1 + len(ARMS) * config.rounds)
    for seed in config.seeds:
        for round_, arm in _trainings(config):
            record = records[seed, round_, arm]
            # The watcher ran (and checked) after each step, from a fresh optimizer.
            assert record["steps"] == list(range(1, config.train_steps + 1))
            pruned = sum(int(np.sum(m == 0)) for m in record["masks"])
            assert (pruned > 0) == (round_ > 0)
            for (end, _), (start, _), mask in zip(
                record["end"], record["start"], record["masks"]
            ):
                assert np.any(end[mask > 0] != start[mask > 0])  # Survivors train.


def test_remaining_fraction_follows_the_schedule(tiny):
    config, _, metrics, records = tiny
    names = list(metrics["layers"])
    for seed in config.seeds:
        for round_, arm in _trainings(config):
            masks = records[seed, round_, arm]["masks"]
            reported = metrics["seeds"][str(seed)]["ticket" if arm == "dense" else arm]
            for index, (name, mask) in enumerate(zip(names, masks)):
                rate = config.prune_rate / (2 if index == len(names) - 1 else 1)
                scheduled = (1 - rate) ** round_ * mask.size
                kept = np.count_nonzero(mask)
                assert abs(kept - scheduled) <= 1, (seed, round_, arm, name)
                assert set(np.unique(mask)) <= {0.0, 1.0}
                assert reported[round_]["remaining"][name] == kept / mask.size


def test_ticket_prunes_the_smallest_survivors_of_the_last_training(tiny):
    config, _, _, records = tiny
    for seed in config.seeds:
        previous = records[seed, 0, "dense"]
        for round_ in range(1, config.rounds + 1):
            ticket = records[seed, round_, "ticket"]
            for (kernel, _), before, mask in zip(
                previous["end"], previous["masks"], ticket["masks"]
            ):
                assert np.all(mask <= before)  # Pruned weights stay pruned.
                magnitudes = np.abs(kernel)
                dropped = magnitudes[(before > 0) & (mask == 0)]
                assert dropped.size > 0
                assert magnitudes[mask > 0].min() >= dropped.max()
            previous = ticket


def test_rewind_restores_every_survivor_bit_for_bit(tiny):
    config, _, _, records = tiny
    for seed in config.seeds:
        at_rewind = records[seed, 0, "dense"]["at_rewind"]
        for round_ in range(1, config.rounds + 1):
            for arm in ("ticket", "random"):
                record = records[seed, round_, arm]
                _assert_bits_equal(
                    sum(record["start"], []),
                    sum(_rewound(at_rewind, record["masks"]), []),
                )


def test_rewinding_to_step_0_restores_the_original_initialisation(tmp_path):
    config = dataclasses.replace(
        TINY, train_steps=4, eval_every=2, rounds=1, rewind_step=0, seeds=(3,)
    )
    _, records = _watched_run(config, str(tmp_path))
    ticket = records[3, 1, "ticket"]
    initial = records[3, 0, "dense"]["start"]
    _assert_bits_equal(
        sum(ticket["start"], []), sum(_rewound(initial, ticket["masks"]), [])
    )


def test_reinit_uses_exactly_the_ticket_masks_with_fresh_weights(tiny):
    config, _, _, records = tiny
    for seed in config.seeds:
        at_rewind = records[seed, 0, "dense"]["at_rewind"]
        for round_ in range(1, config.rounds + 1):
            ticket = records[seed, round_, "ticket"]
            reinit = records[seed, round_, "reinit"]
            for mask, same, (kernel, _), (rewound, _) in zip(
                ticket["masks"], reinit["masks"], reinit["start"], at_rewind
            ):
                np.testing.assert_array_equal(same, mask)
                np.testing.assert_array_equal(kernel[mask == 0], 0.0)
                assert not np.any(kernel[mask > 0] == rewound[mask > 0])


def test_random_pruning_matches_the_ticket_sparsity_per_layer(tiny):
    config, _, _, records = tiny
    for seed in config.seeds:
        previous = records[seed, 0, "dense"]["masks"]
        for round_ in range(1, config.rounds + 1):
            ticket = records[seed, round_, "ticket"]["masks"]
            masks = records[seed, round_, "random"]["masks"]
            for mask, same_count, before in zip(masks, ticket, previous):
                assert np.count_nonzero(mask) == np.count_nonzero(same_count)
                assert np.all(mask <= before)  # Nested, like the ticket's.
            assert any(not np.array_equal(a, b) for a, b in zip(masks, ticket))
            previous = masks


def test_run_writes_config_metrics_table_figure_and_events(tiny):
    config, workdir, metrics, _ = tiny
    with open(os.path.join(workdir, "config.json")) as f:
        assert json.load(f) == json.loads(json.dumps(dataclasses.asdict(config)))
    with open(os.path.join(workdir, "metrics.json")) as f:
        assert json.load(f) == json.loads(json.dumps(metrics))
    for arm in ARMS:
        rows = metrics["summary"][arm]
        assert [row["round"] for row in rows] == list(range(config.rounds + 1))
        for row in rows:
            assert len(row["test_accuracy"]["values"]) == len(config.seeds)
            stats = row["early_stop_iteration"]
            assert stats["min"] <= stats["mean"] <= stats["max"] <= config.train_steps
        tags = checks.scalar_tags(os.path.join(workdir, "tensorboard", arm))
        assert {"test_accuracy", "early_stop_iteration", "remaining_percent"} <= tags
        assert "round_03/seed_1/validation_loss" in tags
    with open(os.path.join(workdir, "table.md")) as f:
        text = f.read()
    # metrics.json holds all the table shows (JSON sorts the arms; the table not).
    summary = json.loads(json.dumps(metrics["summary"], sort_keys=True))
    assert lottery_ticket_report.table(summary, list(metrics["layers"])) == text
    lines = text.splitlines()
    rows = [line for line in lines if line.startswith("| ")]
    assert len(rows) == 2 + config.rounds + 1  # Header, rule, a row per round.
    stopped_at_end = [
        row["stopped_at_end"] for rows in metrics["summary"].values() for row in rows
    ]
    assert any(line.startswith("\\*") for line in lines) == any(stopped_at_end)
    with open(os.path.join(workdir, "lottery_ticket.png"), "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"


def test_early_stop_is_the_step_of_least_validation_loss(tiny):
    _, _, metrics, _ = tiny
    for results in metrics["seeds"].values():
        for result in results["ticket"]:
            steps, losses, accuracies = zip(*result["curve"])
            best = int(np.argmin(losses))
            assert result["early_stop_iteration"] == steps[best]
            assert result["test_accuracy"] == accuracies[best]
            assert result["stopped_at_end"] == (best == len(steps) - 1)


(
    test_figure_is_skipped_with_a_warning_without_matplotlib,
    test_run_without_scikit_learn_says_what_to_install_before_writing,
) = checks.optional_extras_tests(
    lambda tiny, path: lottery_ticket_report.figure(tiny[2]["summary"], tiny[0], path),
    run,
    TINY,
)


test_config_rejects_invalid_values = checks.config_rejects_test(
    Config,
    [
        ("hidden_units", (), "non-empty tuple"),
        ("hidden_units", (300, 0), "positive integers"),
        ("seeds", (0, 0), "distinct seeds"),
        ("seeds", (-1,), "non-negative integers"),
        ("rounds", 0, "a positive integer"),
        ("train_steps", 2.5, "a positive integer"),
        ("rewind_step", 1500, "below train_steps=1500"),
        ("prune_rate", 1.0, "number in \\(0, 1\\)"),
        ("learning_rate", float("nan"), "positive number"),
        ("test_fraction", 0.9, "sum below 1"),
        ("optimizer", "nope", "expected one of .*sgd"),
    ],
    received="Received:.*{field}=",
)


def test_config_takes_lists_as_tuples():
    config = Config(hidden_units=[4, 2], seeds=[5])
    assert config.hidden_units == (4, 2) and config.seeds == (5,)


# main runs in a subprocess: its flags share names with learnable_scale's.

BAD_FLAGS = {
    "--prune_rate=1.5": "Received: prune_rate=1.5",
    "--seeds=0,x": "--seeds takes comma-separated integers",
    "--rewind_step=-1": "Received: rewind_step=-1",
    "--optimizer=nope": "known ones are",
}


@pytest.mark.slow
def test_main_refuses_bad_flags_before_writing_and_runs_good_ones(tmp_path):
    # The usage argv runs as the command line does: app.run prints the error.
    good = checks.assert_main_refuses_bad_flags(
        "lottery_ticket",
        BAD_FLAGS,
        [
            "--hidden_units=6",
            "--seeds=4",
            "--rounds=1",
            "--train_steps=4",
            "--eval_every=2",
            "--optimizer=sgd",
        ],
        ("--rounds=0", "Received: rounds=0"),
        tmp_path,
        timeout=120,
    )
    with open(good / "config.json") as f:
        config = json.load(f)
    expected = dataclasses.replace(
        Config(),
        hidden_units=(6,),
        seeds=(4,),
        rounds=1,
        train_steps=4,
        eval_every=2,
        optimizer="sgd",
    )
    assert config == json.loads(json.dumps(dataclasses.asdict(expected)))
    with open(good / "metrics.json") as f:
        assert list(json.load(f)["layers"]) == ["hidden_1", "output"]
