"""Tests of experiments.continual_learning: PackNet's exact promises, baselines, CLI.

The promises are checked against what the tests record themselves (weights,
owners and logits after every task), not against what the run reports.
"""

import dataclasses
import json
import os

import keras
import numpy as np
import pytest

from experiments import common
from experiments.continual_learning import gradmask, methods, net, packnet, report
from experiments.continual_learning import tasks as tasks_lib
from experiments.continual_learning.lib import (
    METHODS,
    Config,
    learn_sequence,
    make_method,
    run,
)
from tests.helpers import experiment_checks as checks

# Digits: no generation; few steps per task (about 5 batches a pass). The
# control (packnet_gradmask) runs on TensorFlow only.
ON_TENSORFLOW = keras.backend.backend() == "tensorflow"
TINY = Config(
    sequences=("permuted_digits",),
    permuted_tasks=3,
    methods=METHODS if ON_TENSORFLOW else METHODS[:-1],
    hidden_units=(12,),
    epochs=2,
    retrain_epochs=1,
    prune_fraction=0.5,
    ewc_samples=32,
    seeds=(0,),
    optimizer="adamw",
    weight_decay=0.1,
    learning_rate=0.01,
    batch_size=128,
)
OPTIMIZERS = {
    "adam": dict(optimizer="adam"),
    "adamw": dict(optimizer="adamw", weight_decay=0.1),
}


def _bits(array):
    return np.asarray(array, np.float32).view(np.uint32)


def _split_digits(tasks=3):
    """Split digits (a head per task), cut to its first `tasks` tasks."""
    sequence = tasks_lib.load("split_digits")
    return dataclasses.replace(sequence, tasks=sequence.tasks[:tasks])


def _settings(compile_kwargs, optimizer):
    return net.TrainSettings(
        learning_rate=0.01,
        batch_size=128,
        compile_kwargs=dict(compile_kwargs, steps_per_execution=2),
        **OPTIMIZERS[optimizer],
    )


class _Recorder:
    """Records weights, owners and logits after every task of a learner."""

    def __init__(self):
        self.after = []

    def __call__(self, task_index, method, logits):
        record = {"weights": method.networks[-1].weights(), "logits": logits}
        if hasattr(method, "owners"):
            record["owners"] = {k: v.copy() for k, v in method.owners.items()}
        self.after.append(record)


def _check_packnet_records(recorder, network):
    """Free entries are +0 after each task; logits and owned entries never change."""
    last = recorder.after[-1]
    for t, record in enumerate(recorder.after):
        np.testing.assert_array_equal(
            _bits(last["logits"][t]), _bits(record["logits"][t])
        )
        for layer in network.layers:  # Pruned in retraining, free for the next: +0.
            free = record["owners"][layer.name] == packnet.FREE
            kernel = record["weights"][layer.name][0]
            np.testing.assert_array_equal(_bits(kernel[free]), 0)
        for later in recorder.after[t + 1 :]:
            for layer in network.layers:
                owned = record["owners"][layer.name] == t + 1
                assert owned.any()
                kernel = record["weights"][layer.name][0]
                np.testing.assert_array_equal(
                    _bits(later["weights"][layer.name][0][owned]), _bits(kernel[owned])
                )
                # The owners of earlier tasks never change either.
                np.testing.assert_array_equal(later["owners"][layer.name][owned], t + 1)
    first = recorder.after[0]["weights"]
    for later in recorder.after[1:]:
        for layer in network.layers[:-1]:  # Hidden biases: frozen after task 0.
            np.testing.assert_array_equal(
                _bits(later["weights"][layer.name][1]), _bits(first[layer.name][1])
            )


@pytest.mark.backends("tensorflow", "jax")
@pytest.mark.slow
@pytest.mark.parametrize("optimizer", sorted(OPTIMIZERS))
def test_packnet_keeps_earlier_tasks_bit_for_bit(mode, optimizer):
    sequence = _split_digits()
    network = net.Network(64, (10, 6), sequence.heads, 2, [0, 0])
    learner = packnet.PackNet(network, _settings(mode, optimizer), 0, 2, 1, 0.5)
    recorder = _Recorder()
    result = learn_sequence(learner, sequence, recorder)
    _check_packnet_records(recorder, network)
    assert result["backward_transfer"] == 0.0
    assert result["logits_identical"] == [True, True]
    # A head per task: each task's head columns (kernel and bias) move only in it.
    for t, record in enumerate(recorder.after[:-1]):
        columns = network.head_columns(t)
        for later in recorder.after[t + 1 :]:
            for index in (0, 1):
                np.testing.assert_array_equal(
                    _bits(later["weights"]["head"][index][..., columns]),
                    _bits(record["weights"]["head"][index][..., columns]),
                )


@pytest.mark.slow
def test_packnet_packs_a_shared_head_like_the_hidden_layers():
    sequence = tasks_lib.load("permuted_digits", permuted_tasks=3)
    network = net.Network(64, (10,), 1, 10, [1, 0])
    learner = packnet.PackNet(network, _settings({}, "adamw"), 1, 2, 1, 0.5)
    recorder = _Recorder()
    learn_sequence(learner, sequence, recorder)
    _check_packnet_records(recorder, network)
    head_bias = [r["weights"]["head"][1] for r in recorder.after]
    for later in head_bias[1:]:
        np.testing.assert_array_equal(_bits(later), _bits(head_bias[0]))
    capacity = learner.capacity(3)
    for layer in network.layers:
        shares = capacity[layer.name]["per_task"]
        assert shares == pytest.approx([0.5, 0.25, 0.125], abs=0.01)
        assert capacity[layer.name]["free"] == pytest.approx(0.125, abs=0.01)


@pytest.mark.slow
@pytest.mark.parametrize("optimizer, drifts", [("adamw", True), ("adam", False)])
def test_hand_written_gradient_masks_let_weight_decay_move_earlier_tasks(
    optimizer, drifts
):
    # The control: the same PackNet with gradients multiplied by 0/1 masks.
    sequence = tasks_lib.load("permuted_digits", permuted_tasks=2)
    network = net.Network(64, (10,), 1, 10, [6, 0], gradmask.HandMaskedModel)
    settings = _settings({}, optimizer)
    learner = gradmask.HandMaskedPackNet(network, settings, 6, 2, 1, 0.5)
    recorder = _Recorder()
    result = learn_sequence(learner, sequence, recorder)
    first, last = recorder.after
    owned = first["owners"]["hidden_1"] == 1
    before = first["weights"]["hidden_1"][0][owned]
    after = last["weights"]["hidden_1"][0][owned]
    if drifts:  # Decoupled weight decay shrinks every entry, masked or not.
        assert np.all(np.abs(after) < np.abs(before))
        assert result["logits_identical"] == [False]
    else:  # A new Adam never moves an entry that never had a gradient.
        np.testing.assert_array_equal(_bits(after), _bits(before))
        assert result["logits_identical"] == [True]


@pytest.mark.backends("tensorflow", "jax")
def test_prune_keeps_the_largest_free_weights_and_zeroes_the_rest(monkeypatch):
    sequence = tasks_lib.load("permuted_digits", permuted_tasks=2)
    network = net.Network(64, (10,), 1, 10, [2, 0])
    monkeypatch.setattr(network, "train", lambda *args, **kwargs: None)
    learner = packnet.PackNet(network, _settings({}, "adam"), 2, 1, 1, 0.6)
    initial = network.weights()
    learner.learn(0, sequence.tasks[0])
    for layer in network.layers:
        kernel, owners = layer.kernel.numpy(), learner.owners[layer.name]
        kept = owners == 1
        assert kept.sum() == round(0.4 * kernel.size)
        magnitudes = np.abs(initial[layer.name][0])
        assert magnitudes[kept].min() >= magnitudes[~kept].max()
        np.testing.assert_array_equal(
            _bits(kernel[kept]), _bits(initial[layer.name][0][kept])
        )
        np.testing.assert_array_equal(_bits(kernel[~kept]), _bits(0.0))  # +0 only.
    # The next task may train exactly the free entries.
    learner.learn(1, sequence.tasks[1])
    for layer in network.layers:
        owners = learner.owners[layer.name]
        free = owners.size - round(0.4 * owners.size)
        assert (owners == 2).sum() == round(0.4 * free)


@pytest.mark.backends("tensorflow", "jax")
def test_inference_masks_zero_later_and_free_weights_in_the_forward_pass_only():
    sequence = tasks_lib.load("permuted_digits", permuted_tasks=2)
    network = net.Network(64, (10,), 1, 10, [3, 0])
    settings = _settings({}, "adam")
    learner = packnet.PackNet(network, settings, 3, 1, 1, 0.5)
    x = sequence.tasks[0].x_test
    network.task_logits(settings, x, 0)  # Compiled before the weights change.
    for index, task in enumerate(sequence.tasks):
        learner.learn(index, task)
    before = network.weights()
    logits = learner.logits(0, sequence.tasks[0], x)
    (k1, b1), (k2, b2) = before["hidden_1"], before["head"]
    m1, m2 = (learner.owners[n] == 1 for n in ("hidden_1", "head"))
    expected = np.maximum(x @ np.where(m1, k1, 0) + b1, 0) @ np.where(m2, k2, 0) + b2
    np.testing.assert_allclose(logits, expected, rtol=1e-5, atol=1e-5)
    unmasked = network.task_logits(settings, x, 0)
    assert np.max(np.abs(unmasked - logits)) > 1e-3  # Task 1's weights count there.
    for name, (kernel, _bias) in network.weights().items():
        np.testing.assert_array_equal(_bits(kernel), _bits(before[name][0]))


def test_finetuning_forgets_where_the_tasks_conflict():
    sequence = tasks_lib.load("permuted_digits", permuted_tasks=2)
    config = dataclasses.replace(TINY, hidden_units=(32,), epochs=15)
    learner = make_method("finetune", sequence, config, seed=0)
    result = learn_sequence(learner, sequence)
    first = [row[0] for row in result["accuracy"]]
    assert first[0] > 0.8  # Learned,
    assert first[1] < first[0] - 0.2  # then forgotten by the second task.
    assert result["backward_transfer"] < -0.2
    assert result["logits_identical"] == [False]


@pytest.mark.backends("tensorflow", "jax")
def test_ewc_penalty_is_the_merged_quadratic_of_every_earlier_task():
    sequence = tasks_lib.load("permuted_digits", permuted_tasks=3)
    config = dataclasses.replace(TINY, ewc_strength=3.0)
    learner = make_method("ewc", sequence, config, seed=0)
    variables = [v for l in learner.network.layers for v in (l.kernel, l.bias)]
    fishers, anchors = [], []
    for index, task in enumerate(sequence.tasks[:2]):
        learner.learn(index, task)
        total = [p.fisher.numpy() for p in learner._penalties]
        fishers.append([t - sum(f) for t, *f in zip(total, *fishers)])
        anchors.append([v.numpy() for v in variables])
    assert all(np.all(f >= 0) for f in fishers[1]) and any(f.any() for f in fishers[1])
    # Σ_k F_k (θ - θ*_k)² and the stored F (θ - θ̄)² have the same gradient.
    rng = np.random.default_rng(0)
    theta = [v.numpy() + rng.normal(size=v.shape).astype(np.float32) for v in variables]
    for i, penalty in enumerate(learner._penalties):
        each = sum(f[i] * (theta[i] - a[i]) for f, a in zip(fishers, anchors))
        merged = penalty.fisher.numpy() * (theta[i] - penalty.anchor.numpy())
        np.testing.assert_allclose(merged, each, rtol=1e-4, atol=1e-6)
    # The model's losses hold the penalty, with its strength.
    for variable, value in zip(variables, theta):
        variable.assign(value)
    expected = sum(
        np.sum(p.fisher.numpy() * (t - p.anchor.numpy()) ** 2)
        for p, t in zip(learner._penalties, theta)
    )
    penalty = float(sum(learner.network.model.losses))
    np.testing.assert_allclose(penalty, 0.5 * 3.0 * expected, rtol=1e-4)


@pytest.mark.slow
def test_each_training_starts_from_a_new_optimizer():
    sequence = tasks_lib.load("permuted_digits", permuted_tasks=2)
    settings = _settings({}, "adamw")
    network = net.Network(64, (8,), 1, 10, [5, 0])
    optimizers = []
    for index, task in enumerate(sequence.tasks):
        network.train(settings, task.x_train, task.y_train, 1, [index])
        optimizers.append(network.model.optimizer)
        steps = len(task.x_train) // settings.batch_size
        assert int(network.model.optimizer.iterations.numpy()) == steps
    assert optimizers[0] is not optimizers[1]


@pytest.mark.backends("tensorflow", "jax")
def test_numpy_weights_start_every_backend_from_the_same_kernels():
    network = net.Network(64, (10,), 2, 2, [4, 0], numpy_weights=True)
    for index, layer in enumerate(network.layers):
        expected = common.glorot_uniform(layer.kernel.shape, [4, 0, index])
        np.testing.assert_array_equal(layer.kernel.numpy(), expected)
        np.testing.assert_array_equal(layer.bias.numpy(), 0.0)
    limit = np.sqrt(6.0 / (64 + 10))
    first = network.layers[0].kernel.numpy()
    assert np.abs(first).max() <= limit and first.std() > limit / 3
    keras_drawn = net.Network(64, (10,), 2, 2, [4, 0])
    assert not np.array_equal(keras_drawn.layers[0].kernel.numpy(), first)


@pytest.mark.backends("jax")
def test_the_control_is_refused_off_tensorflow():
    with pytest.raises(ValueError, match="packnet_gradmask.*TensorFlow only.*jax"):
        Config(methods=("packnet", "packnet_gradmask"))


@pytest.mark.backends("tensorflow", "jax")
def test_bad_sequences_for_a_learner_raise_one_clear_error():
    sequence = _split_digits()
    network = net.Network(64, (4,), sequence.heads, 2, [7, 0])
    learner = packnet.PackNet(network, _settings({}, "adam"), 7, 1, 1, 0.5)
    with pytest.raises(ValueError, match="task 0 must answer with head 0.*head=1"):
        learner.learn(0, sequence.tasks[1])
    assert all(not np.any(o == 1) for o in list(learner.owners.values())[:-1])
    one = dataclasses.replace(sequence, tasks=sequence.tasks[:1])
    with pytest.raises(ValueError, match="fewer than 2 tasks.*with 1 task"):
        learn_sequence(learner, one)


@pytest.mark.backends("tensorflow", "jax")
def test_separate_networks_are_no_larger_than_one_network():
    for name in ("split_digits", "permuted_digits"):
        sequence = tasks_lib.load(name, permuted_tasks=4)
        units = methods.separate_hidden_units(
            64, (100, 50), sequence, len(sequence.tasks)
        )
        one = net.parameter_count(
            64, (100, 50), sequence.heads * sequence.classes_per_head
        )
        each = net.parameter_count(64, units, sequence.classes_per_head)
        assert len(sequence.tasks) * each <= one
        bigger = tuple(u + 1 for u in units)
        grown = net.parameter_count(64, bigger, sequence.classes_per_head)
        assert len(sequence.tasks) * grown > one


def _watched_run(config, workdir):
    records = {}

    def observe(sequence, seed, method, task_index, learner, logits):
        recorder = records.setdefault((sequence, seed, method), _Recorder())
        recorder(task_index, learner, logits)
        recorder.network = learner.networks[0]

    return run(config, workdir, observe=observe), records


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    workdir = str(tmp_path_factory.mktemp("continual"))
    metrics, records = _watched_run(TINY, workdir)
    return workdir, metrics, records


@pytest.mark.backends("tensorflow", "jax")
@pytest.mark.slow
def test_tiny_run_packnet_forgets_nothing_and_reports_it(tiny):
    _, metrics, records = tiny
    recorder = records["permuted_digits", 0, "packnet"]
    _check_packnet_records(recorder, recorder.network)
    result = metrics["seeds"]["permuted_digits"]["0"]["packnet"]
    assert result["backward_transfer"] == 0.0
    assert result["logits_identical"] == [True, True]
    assert result["max_logit_change"] == [0.0, 0.0]
    for j in range(3):
        column = [row[j] for row in result["accuracy"][j:]]
        assert column == [column[0]] * len(column)
    for control in ("finetune", "packnet_gradmask")[: 2 if ON_TENSORFLOW else 1]:
        # AdamW moves both.
        result = metrics["seeds"]["permuted_digits"]["0"][control]
        assert result["logits_identical"] == [False, False]


@pytest.mark.backends("tensorflow", "jax")
@pytest.mark.slow
def test_tiny_run_reports_the_matrix_average_and_backward_transfer(tiny):
    _, metrics, records = tiny
    for method in TINY.methods:
        result = metrics["seeds"]["permuted_digits"]["0"][method]
        matrix = result["accuracy"]
        logits = records["permuted_digits", 0, method].after
        y = tasks_lib.load("permuted_digits", permuted_tasks=3).tasks[0].y_test
        for i, record in enumerate(logits):
            assert matrix[i][0] == np.mean(np.argmax(record["logits"][0], -1) == y)
            assert matrix[i][i + 1 :] == [None] * (2 - i)
            assert result["average_accuracy"][i] == pytest.approx(
                np.mean(matrix[i][: i + 1])
            )
        expected = np.mean([matrix[2][j] - matrix[j][j] for j in range(2)])
        assert result["backward_transfer"] == pytest.approx(expected)
    sizes = {
        m: metrics["summary"]["permuted_digits"][m]["parameters"] for m in TINY.methods
    }
    assert sizes["separate"] <= sizes["packnet"] == sizes["finetune"] == sizes["ewc"]


@pytest.mark.backends("tensorflow", "jax")
@pytest.mark.slow
def test_tiny_run_writes_config_metrics_table_figure_and_events(tiny):
    workdir, metrics, _ = tiny
    text, summary = checks.written_config_metrics_and_table(workdir, TINY, metrics)
    assert report.tables(summary, metrics["tasks"]) == text
    assert "| PackNet |" in text and "2 of 2 (max change 0)" in text
    with open(os.path.join(workdir, "continual_learning.png"), "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    for method in TINY.methods:
        tags = checks.scalar_tags(
            os.path.join(workdir, "tensorboard", "permuted_digits", method)
        )
        assert {"average_accuracy", "task_1", "task_3", "backward_transfer"} <= tags
        assert "seed_0/task_2" in tags


(
    test_figure_is_skipped_with_a_warning_without_matplotlib,
    test_run_without_scikit_learn_says_what_to_install_before_writing,
) = checks.optional_extras_tests(
    lambda tiny, path: report.figure(tiny[1]["summary"], TINY, path), run, TINY
)


test_config_rejects_invalid_values = checks.config_rejects_test(
    Config,
    [
        ("sequences", (), "distinct names among"),
        ("sequences", ("split_mnist",), "among split_digits, split_mnist1d, permuted"),
        ("methods", ("packnet", "packnet"), "distinct names among"),
        ("methods", ("piggyback",), "packnet, finetune, separate, ewc"),
        ("hidden_units", (8, 0), "integers >= 1"),
        ("seeds", (1, 1), "distinct seeds"),
        ("permuted_tasks", 1, "an integer >= 2"),
        ("epochs", 0, "an integer >= 1"),
        ("retrain_epochs", -1, "an integer >= 0"),
        ("prune_fraction", 1.0, "a number in \\(0, 1\\)"),
        ("prune_fraction", 0, "a number in \\(0, 1\\)"),
        ("learning_rate", float("inf"), "a positive number"),
        ("weight_decay", -0.1, "None or a number >= 0"),
        ("ewc_strength", float("nan"), "a non-negative number"),
        ("mnist1d_samples", 10, "an integer >= 100"),
        ("batch_size", True, "an integer >= 1"),
        ("jit_compile", "yes", "a bool"),
        ("optimizer", "adamm", "expected one of .*sgd"),
    ],
    received="Received:.*{field}=",
)


def test_config_takes_lists_as_tuples():
    config = Config(sequences=["split_digits"], hidden_units=[4], seeds=[2])
    assert config.sequences == ("split_digits",) and config.hidden_units == (4,)


_BAD_FLAGS = {
    "--prune_fraction=1.5": "Received: prune_fraction=1.5",
    "--seeds=0,x": "--seeds takes comma-separated integers",
    "--sequences=split_cifar": "Received: sequences=('split_cifar',)",
    "--optimizer=nope": "known ones are",
}


@pytest.mark.slow
def test_main_refuses_bad_flags_before_writing_and_runs_good_ones(tmp_path):
    good = tmp_path / "good"
    outcomes = checks.assert_cli_refuses_bad_flags(
        "continual_learning",
        _BAD_FLAGS,
        tmp_path,
        [
            [
                "continual_learning",
                "--sequences=permuted_digits",
                "--permuted_tasks=2",
                "--methods=packnet,finetune",
                "--hidden_units=6",
                "--epochs=1",
                "--retrain_epochs=1",
                "--seeds=4",
                "--optimizer=adamw",
                "--weight_decay=0.05",
                f"--workdir={good}",
            ]
        ],
    )
    assert all(outcome["code"] == 1 for outcome in outcomes[:-1])
    assert not outcomes[-1]["code"], outcomes[-1]["output"][-2000:]
    with open(good / "config.json") as f:
        config = json.load(f)
    expected = dataclasses.replace(
        Config(),
        sequences=("permuted_digits",),
        permuted_tasks=2,
        methods=("packnet", "finetune"),
        hidden_units=(6,),
        epochs=1,
        retrain_epochs=1,
        seeds=(4,),
        optimizer="adamw",
        weight_decay=0.05,
    )
    assert config == json.loads(json.dumps(dataclasses.asdict(expected)))
    with open(good / "metrics.json") as f:
        metrics = json.load(f)
    assert (
        metrics["seeds"]["permuted_digits"]["4"]["packnet"]["backward_transfer"] == 0.0
    )
    assert os.path.exists(good / "continual_learning.png")
