"""Tests of experiments.sparse_training: a tiny run watched step by step, and the CLI.

A callback on every training records the kernels at its start and after every
step; the tests check the experiment's promises (masked weights exactly 0,
pruning reaches its target and keeps it, every sparse method trains as many
weights per layer, paired starts) against those records.
"""

import json
import os

import keras
import numpy as np
import pytest

import maskfit
from experiments import common
from experiments.sparse_training import report, train
from experiments.sparse_training.lib import Config, run
from maskfit import model as model_lib
from maskfit import pruning, sparse
from tests.helpers import experiment_checks as checks

# One step per execution, so that the watcher sees every step.
TINY = Config(
    tasks=("digits/mlp", "mnist1d/cnn"),
    sparsities=(0.9,),
    seeds=(0,),
    train_steps=24,
    eval_every=12,
    steps_per_execution=1,
    mlp_units=(16,),
    cnn_filters=(4, 6),
    delta_t=4,
)


def _kernels(model):
    return {l.name: l.kernel.numpy() for l in model.layers if hasattr(l, "kernel")}


def _keeps(model):
    """`{layer name: keep mask}` of the kernels a rule covers (pruning, SET, RigL)."""
    variables = model_lib.all_trainable_variables(model)
    keeps = model_lib.keep_masks(model)
    return {
        l.name: keeps[i].copy()
        for l in model.layers
        if hasattr(l, "kernel")
        for i, v in enumerate(variables)
        if v is l.kernel and i in keeps
    }


class _Watch(keras.callbacks.Callback):
    """Records the kernels and ElementMasks at the start, and after every step the
    kernels and the rules' keep masks."""

    def __init__(self, record):
        super().__init__()
        self._record = record

    def on_train_begin(self, logs=None):
        layers = [l for l in self.model.layers if hasattr(l, "kernel")]
        spec = {l.name: maskfit.get_mask(l) for l in layers}
        self._record["masks"] = {
            name: None if s is None else np.asarray(s.masks["kernel"]).astype(bool)
            for name, s in spec.items()
        }
        self._record["start"] = _kernels(self.model)
        self._record["steps"] = []

    def on_train_batch_end(self, batch, logs=None):
        step = int(self.model.optimizer.iterations.numpy())
        self._record["steps"].append((step, _kernels(self.model)))
        self._record.setdefault("keeps", []).append(_keeps(self.model))


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    records = {}

    def callbacks_for(task, method, sparsity, seed):
        return [_Watch(records.setdefault((task, method, sparsity, seed), {}))]

    workdir = str(tmp_path_factory.mktemp("sparse_training"))
    metrics = run(TINY, workdir, callbacks_for=callbacks_for)
    return workdir, metrics, records


def _sparse_keys(config):
    for task in config.tasks:
        for sparsity in config.sparsities:
            yield task, sparsity


def test_every_training_ran_the_budget(tiny):
    _, metrics, records = tiny
    expected = {
        (task, method, sparsity, seed)
        for seed in TINY.seeds
        for task in TINY.tasks
        for method in TINY.methods
        for sparsity in ((0.0,) if method == "dense" else TINY.sparsities)
    }
    assert set(records) == expected
    for record in records.values():
        assert [s for s, _ in record["steps"]] == list(range(1, TINY.train_steps + 1))
    assert len(metrics["results"]) == len(expected)


def test_static_masked_weights_are_zero_after_every_step_and_masks_are_allocated(tiny):
    _, _, records = tiny
    for task, sparsity in _sparse_keys(TINY):
        record = records[task, "static", sparsity, 0]
        for _, kernels in [(0, record["start"])] + record["steps"]:
            for name, mask in record["masks"].items():
                np.testing.assert_array_equal(kernels[name][~mask], 0.0)
        survivors = record["steps"][-1][1]
        for name, mask in record["masks"].items():
            # Survivors train (not all: digits has pixels that are always 0,
            # and a tiny CNN's dead ReLU channels get no gradient).
            assert np.any(survivors[name][mask] != record["start"][name][mask])


def test_static_starts_from_the_dense_weights_of_the_seed(tiny):
    _, _, records = tiny
    for task, sparsity in _sparse_keys(TINY):
        dense = records[task, "dense", 0.0, 0]["start"]
        static = records[task, "static", sparsity, 0]
        for name, mask in static["masks"].items():
            np.testing.assert_array_equal(
                static["start"][name][mask], dense[name][mask]
            )


def test_pruning_reaches_each_layers_sparsity_and_keeps_it(tiny):
    _, metrics, records = tiny
    schedule = train.pruning_schedule(0.5, TINY)
    last_pruning = schedule.get_config()["end_step"]  # TF-MOT's step n: after n steps
    for task, sparsity in _sparse_keys(TINY):
        record = records[task, "pruning", sparsity, 0]
        result = next(
            r
            for r in metrics["results"]
            if (r["task"], r["method"], r["sparsity"]) == (task, "pruning", sparsity)
        )
        zeros_at_end = None
        for step, kernels in record["steps"]:
            if step < last_pruning:
                continue
            zeros = {n: k == 0 for n, k in kernels.items()}
            if zeros_at_end is None:
                zeros_at_end = zeros
                for name, allocated in result["allocated"].items():
                    kept = pruning.kept_count(kernels[name].size, np.float32(allocated))
                    assert np.count_nonzero(~zeros[name]) == kept, (task, name)
            for name in zeros:
                np.testing.assert_array_equal(zeros[name], zeros_at_end[name])


def test_sparse_methods_train_as_many_weights_per_layer(tiny):
    _, metrics, _ = tiny
    for task, sparsity in _sparse_keys(TINY):
        found = {
            r["method"]: r
            for r in metrics["results"]
            if r["task"] == task and r["sparsity"] == sparsity
        }
        static, pruned = found["static"], found["pruning"]
        assert static["allocated"] == pruned["allocated"]
        for name, density in static["kernel_density"].items():
            # Magnitude pruning rounds the kept count to nearest, RigL's masks down.
            assert abs(density - pruned["kernel_density"][name]) <= 1.5 / 16


def test_allocation_is_erk_over_the_models_kernels(tiny):
    _, metrics, _ = tiny
    for result in metrics["results"]:
        if result["method"] == "dense":
            assert result["allocated"] == {} and result["kernel_density"]["all"] == 1.0
            continue
        model = train.build_model(
            result["task"].split("/")[1],
            64 if "digits" in result["task"] else 40,
            10,
            TINY,
        )
        expected = sparse.allocate(
            model, result["sparsity"], TINY.sparsity_distribution
        )
        assert result["allocated"] == {e.layer.name: e.sparsity for e in expected}


def test_run_writes_config_metrics_table_figure_and_events(tiny):
    workdir, metrics, _ = tiny
    text, summary = checks.written_config_metrics_and_table(workdir, TINY, metrics)
    assert report.table(summary, TINY) == text
    for task in TINY.tasks:
        assert f"**{task}**" in text
        for method in TINY.methods:
            rows = metrics["summary"][task][method]
            sparsities = (0.0,) if method == "dense" else TINY.sparsities
            assert [row["sparsity"] for row in rows] == list(sparsities)
            tags = checks.scalar_tags(
                os.path.join(workdir, "tensorboard", task, method)
            )
            assert {"test_accuracy", "kernel_density"} <= tags
    with open(os.path.join(workdir, "sparse_training.png"), "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"


def test_summary_spreads_over_seeds():
    results = [
        {
            "task": "t",
            "method": "static",
            "sparsity": 0.9,
            "seed": seed,
            "test_accuracy": acc,
            "kernel_density": {"all": 0.1},
        }
        for seed, acc in ((2, 0.6), (0, 0.4))
    ]
    (row,) = report.summarize(results)["t"]["static"]
    assert row["seeds"] == [0, 2]
    assert row["test_accuracy"]["values"] == [0.4, 0.6]
    assert row["test_accuracy"]["mean"] == pytest.approx(0.5)
    assert row["test_accuracy"]["std"] == pytest.approx(0.1)


def test_set_and_rigl_start_from_the_static_mask_and_move_it_exactly(tiny):
    _, metrics, records = tiny
    for task, sparsity in _sparse_keys(TINY):
        static = records[task, "static", sparsity, 0]["masks"]
        for method in ("set", "rigl"):
            record = records[task, method, sparsity, 0]
            keeps = record["keeps"]
            # After step 1 (no update yet): the static arm's mask, layer by layer.
            assert sorted(keeps[0]) == sorted(
                n for n, m in static.items() if m is not None
            )
            for name, keep in keeps[0].items():
                np.testing.assert_array_equal(keep, static[name])
            # RigL moves after steps 4, 8, ... until t_end = 18; SET at the
            # start of the step after (by the cosine, too few to move one
            # entry of a small layer late in the run).
            moved = {4, 8, 12, 16} if method == "rigl" else {5, 9, 13, 17}
            first = min(moved)
            for (step, kernels), before, after in zip(
                record["steps"][1:], keeps, keeps[1:]
            ):
                for name, keep in after.items():
                    np.testing.assert_array_equal(kernels[name][~keep], 0.0)
                    assert keep.sum() == before[name].sum()
                changed = any(not np.array_equal(after[n], before[n]) for n in after)
                assert changed <= (step in moved), (task, method, step)
                assert changed or step != first, (task, method, step)
    # Every sparse method trains as many weights per layer.
    for task, sparsity in _sparse_keys(TINY):
        found = {
            r["method"]: r
            for r in metrics["results"]
            if r["task"] == task and r["sparsity"] == sparsity
        }
        assert (
            found["set"]["allocated"]
            == found["rigl"]["allocated"]
            == (found["static"]["allocated"])
        )


def test_the_config_makes_the_rules_with_rigls_names():
    rule = train.dynamic_rule("rigl", 0.9, TINY, seed=3)
    assert rule == sparse.RigL(
        0.9,
        t_end=18,
        delta_t=4,
        alpha=0.3,
        sparsity_distribution="erdos_renyi_kernel",
        seed=3,
    )


test_config_rejects_invalid_values = checks.config_rejects_test(
    Config,
    [
        ("methods", ("dense", "lottery"), "expected names from"),
        ("methods", ("dense", "dense"), "distinct names"),
        ("tasks", ("digits/resnet",), "'<data set>/<model>'"),
        ("tasks", ("mnist/mlp",), "'<data set>/<model>'"),
        ("sparsities", (0.9, 1.0), r"numbers in \(0, 1\)"),
        ("seeds", (1, 1), "distinct seeds"),
        ("train_steps", 0, "a positive integer"),
        ("eval_every", 7, "a divisor of train_steps=3000"),
        ("alpha", 0.0, r"a number in \(0, 1\]"),
        ("prune_begin_fraction", 0.8, "begin < end"),
        ("learning_rate", -1.0, "a positive number"),
        ("optimizer", "nope", "expected one of the keras.optimizers"),
        ("dense_first_layer", "no", "True or False"),
    ],
    received="Received",
)


def test_config_passes_the_rules_own_errors_up():
    with pytest.raises(ValueError, match="distribution must be one of"):
        Config(sparsity_distribution="erk")
    with pytest.raises(ValueError, match="'cosine' or 'constant'"):
        Config(drop_fraction_anneal="linear")


BAD_FLAGS = {
    "--sparsities=0.9,x": "--sparsities takes comma-separated floats",
    "--seeds=-1": "Received: seeds=(-1,)",
    "--methods=dense,snip": "expected names from",
}


@pytest.mark.slow  # a worker process that imports TensorFlow and trains: ~15 s
def test_main_refuses_bad_flags_before_writing_and_runs_good_ones(tmp_path):
    good = checks.assert_main_refuses_bad_flags(
        "sparse_training",
        BAD_FLAGS,
        [
            "--tasks=digits/mlp",
            "--methods=dense,rigl",
            "--sparsities=0.9",
            "--seeds=4",
            "--train_steps=4",
            "--eval_every=2",
            "--mlp_units=6",
        ],
        ("--train_steps=0", "Received: train_steps=0"),
        tmp_path,
    )
    with open(good / "config.json") as f:
        config = json.load(f)
    assert config["tasks"] == ["digits/mlp"] and config["mlp_units"] == [6]
    with open(good / "metrics.json") as f:
        assert len(json.load(f)["results"]) == 2


@pytest.mark.backends("tensorflow", "jax")
def test_the_evaluator_reads_the_weights_of_each_call():
    # Under JAX a tf.function around the model baked the weights of its first
    # call in: every curve point was the starting weights' accuracy.
    data = train.load_data("digits")
    model = train.build_model("mlp", data.features, data.classes, TINY)
    evaluate = train._evaluator(model, data)

    def own():
        hidden = np.maximum(data.x_test @ model.layers[1].kernel.numpy(), 0.0)
        logits = hidden @ model.layers[2].kernel.numpy()
        return np.mean(np.argmax(logits, axis=-1) == data.y_test)

    for seed in (0, 1):
        train.draw_weights(model, [seed])
        assert evaluate() == own()
    first = own()
    train.draw_weights(model, [0])
    assert own() != first  # the two draws score differently


@pytest.mark.backends("tensorflow", "jax")
def test_the_step_is_compiled_on_every_backend():
    # `--nojit_compile` is a tf.function graph on TensorFlow; JAX has no
    # compiled step without XLA, and its `jit_compile=False` runs op by op.
    assert common.compiled_step(True) is True
    assert common.compiled_step(False) is (keras.backend.backend() == "jax")


@pytest.mark.backends("tensorflow", "jax")
def test_numpy_weights_are_the_same_glorot_draw_on_every_backend():
    # Keras's seeded initializers draw other numbers per backend; NumPy's not.
    model = train.build_model("cnn", 40, 10, TINY)
    train.draw_weights(model, [3], numpy=True)
    kernels = [l for l in model.layers if hasattr(l, "kernel")]
    for index, layer in enumerate(model.layers):
        if layer not in kernels:
            continue
        shape = tuple(layer.kernel.shape)
        receptive = int(np.prod(shape[:-2]))
        limit = np.sqrt(6.0 / ((shape[-2] + shape[-1]) * receptive))
        rng = np.random.default_rng(np.random.SeedSequence([3, index]))
        expected = rng.uniform(-limit, limit, shape).astype(np.float32)
        np.testing.assert_array_equal(layer.kernel.numpy(), expected)
        np.testing.assert_array_equal(layer.bias.numpy(), 0.0)
    keras_drawn = train.build_model("cnn", 40, 10, TINY)
    train.draw_weights(keras_drawn, [3])
    first = keras_drawn.get_layer("conv_1").kernel.numpy()
    assert not np.array_equal(first, kernels[0].kernel.numpy())
