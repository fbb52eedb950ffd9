"""SET and RigL as objects: allocation over a model, initial masks, one update, config."""

import json

import keras
import numpy as np
import pytest
import tensorflow as tf

from maskfit import pruning, sparse


def _mlp():
    return keras.Sequential(
        [
            keras.Input((40,)),
            keras.layers.Dense(64, name="first"),
            keras.layers.BatchNormalization(),
            keras.layers.Dense(32, name="hidden"),
            keras.layers.Dense(10, name="head"),
        ]
    )


def _cnn():
    return keras.Sequential(
        [
            keras.Input((40, 1)),
            keras.layers.Conv1D(8, 5, name="conv_1"),
            keras.layers.Conv1D(16, 3, name="conv_2"),
            keras.layers.Flatten(),
            keras.layers.Dense(10, name="head"),
        ]
    )


# Allocation over a model.


@pytest.mark.backends("tensorflow", "jax")  # the rule as the JAX step calls it too
def test_allocate_covers_kernels_in_model_order_at_the_budget():
    model = _cnn()
    entries = sparse.allocate(model, 0.9)
    assert [e.layer.name for e in entries] == ["conv_1", "conv_2", "head"]
    assert [e.variable.path for e in entries] == [
        f"sequential/{n}/kernel" for n in ("conv_1", "conv_2", "head")
    ]
    shapes = {e.variable.path: tuple(e.variable.shape) for e in entries}
    assert [e.sparsity for e in entries] == list(
        sparse.layer_sparsities(shapes, 0.9).values()
    )
    size = sum(np.prod(s) for s in shapes.values())
    assert abs(sum(e.active for e in entries) - 0.1 * size) <= len(entries)
    assert sparse.overall_sparsity(entries) == pytest.approx(0.9, abs=1e-3)


def test_dense_first_layer_and_custom_map_take_layers_out_of_the_budget():
    model = _mlp()
    entries = sparse.allocate(
        model, 0.8, "uniform", dense_first_layer=True, custom_sparsity_map={"head": 0.5}
    )
    assert [(e.layer.name, e.sparsity) for e in entries] == [
        ("first", 0.0),
        ("hidden", 0.8),
        ("head", 0.5),
    ]
    assert entries[0].active == 40 * 64


def test_dense_first_layer_covers_every_weight_of_an_rnn_cell():
    model = keras.Sequential(
        [keras.Input((5, 3)), keras.layers.LSTM(4), keras.layers.Dense(2)]
    )
    entries = sparse.allocate(model, 0.5, dense_first_layer=True)
    assert [(e.variable.name, e.sparsity) for e in entries][:2] == [
        ("kernel", 0.0),
        ("recurrent_kernel", 0.0),
    ]
    assert entries[2].sparsity > 0


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(custom_sparsity_map={"nope": 0.5}), r"names layer 'nope'.*\['first'"),
        (dict(dense_first_layer=True, custom_sparsity_map={"first": 0.5}), "Pass one"),
        (dict(dense_first_layer=1), "must be True or False"),
        (dict(distribution="random"), "RigL's name for the uniform"),
    ],
)
def test_allocate_refuses_bad_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        sparse.allocate(_mlp(), 0.8, **kwargs)


def test_allocate_refuses_a_model_without_prunable_weights_and_shared_names():
    bare = keras.Sequential([keras.Input((3,)), keras.layers.BatchNormalization()])
    with pytest.raises(ValueError, match="no prunable weights"):
        sparse.allocate(bare, 0.5)

    def inner():
        return keras.Sequential([keras.Input((4,)), keras.layers.Dense(4, name="d")])

    inputs = keras.Input((4,))
    model = keras.Model(inputs, inner()(inner()(inputs)))
    with pytest.raises(
        ValueError, match="2 layers with prunable weights have that name"
    ):
        sparse.allocate(model, 0.5, custom_sparsity_map={"d": 0.0})


# Initial masks.


def test_random_keep_mask_is_exact_deterministic_and_keyed():
    mask = sparse.random_keep_mask((30, 20), 0.9, seed=4, key=7)
    assert mask.dtype == bool and mask.shape == (30, 20)
    assert mask.sum() == sparse.active_count(600, 0.9) == 60
    np.testing.assert_array_equal(mask, sparse.random_keep_mask((30, 20), 0.9, 4, 7))
    assert not np.array_equal(mask, sparse.random_keep_mask((30, 20), 0.9, 4, 8))
    assert not np.array_equal(mask, sparse.random_keep_mask((30, 20), 0.9, 5, 7))


def test_random_keep_mask_keeps_frozen_entries_and_counts_them():
    frozen = np.zeros((10, 10), bool)
    frozen[0] = True
    mask = sparse.random_keep_mask((10, 10), 0.8, seed=0, frozen=frozen)
    assert mask[0].all() and mask.sum() == 20
    all_frozen = sparse.random_keep_mask((10, 10), 0.95, seed=0, frozen=frozen)
    np.testing.assert_array_equal(all_frozen, frozen)  # More frozen than the budget.


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(seed=-1), "seed must be a non-negative integer"),
        (dict(key=1.5), "key must be a non-negative integer"),
        (dict(sparsity=1.0), r"must be a number in \[0, 1\)"),
        (dict(frozen=np.zeros((2, 2), bool)), r"frozen must have the weight's shape"),
    ],
)
def test_random_keep_mask_refuses_bad_arguments(kwargs, message):
    arguments = dict(shape=(3, 4), sparsity=0.5, seed=0)
    arguments.update(kwargs)
    with pytest.raises(ValueError, match=message):
        sparse.random_keep_mask(**arguments)


# The rules.


@pytest.mark.backends("tensorflow", "jax")  # the rule as the JAX step calls it too
@pytest.mark.parametrize("rule_class", [sparse.SET, sparse.RigL])
def test_rule_covers_the_sparse_weights_and_starts_from_seeded_masks(rule_class):
    model = _mlp()
    rule = rule_class(0.9, t_end=1000, dense_first_layer=True, seed=3)
    covered = rule.variables(model)
    assert [v.path for v in covered] == [
        "sequential/hidden/kernel",
        "sequential/head/kernel",
    ]
    initial = rule.initial_keep_masks(covered, [None, None])
    entries = rule.allocation(model)[1:]
    assert [e.key for e in entries] == ["hidden/kernel", "head/kernel"]
    for mask, entry in zip(initial, entries):
        assert mask.sum() == entry.active
    # SET and RigL of one seed, and the static baseline, start alike.
    other = (sparse.RigL if rule_class is sparse.SET else sparse.SET)(
        0.9, t_end=5, dense_first_layer=True, seed=3
    )
    for a, b, c in zip(
        initial,
        other.initial_keep_masks(other.variables(model), [None, None]),
        sparse.random_keep_masks(entries, seed=3),
    ):
        np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(a, c)


@pytest.mark.backends("tensorflow", "jax")  # the rule as the JAX step calls it too
def test_initial_keep_masks_keep_what_set_mask_freezes():
    model = _mlp()
    rule = sparse.RigL(0.9, t_end=1000, sparsity_distribution="uniform")
    covered = rule.variables(model)
    frozen = np.zeros((64, 32), bool)
    frozen[:, :4] = True  # 256 entries, more than the 205 the layer keeps
    masks = rule.initial_keep_masks(covered, [None, frozen, None])
    np.testing.assert_array_equal(masks[1], frozen)
    unfrozen = rule.initial_keep_masks(covered, [None] * 3)
    for i in (0, 2):
        np.testing.assert_array_equal(masks[i], unfrozen[i])


def test_a_layer_with_its_own_rule_stays_out_of_the_budget():
    model = _mlp()
    pruning.prune_low_magnitude(model.get_layer("hidden"))
    rule = sparse.RigL(0.8, t_end=1000, sparsity_distribution="uniform")
    assert [v.path for v in rule.variables(model)] == [
        "sequential/first/kernel",
        "sequential/head/kernel",
    ]
    with pytest.raises(ValueError, match="names layer 'hidden', which owns no"):
        sparse.RigL(0.8, t_end=9, custom_sparsity_map={"hidden": 0.5}).variables(model)
    model.get_layer("first").trainable = False
    assert [v.path for v in rule.variables(model)] == ["sequential/head/kernel"]


def _state(model, rule, seed=0):
    """(variable, weights under the initial mask, keep) for each covered weight."""
    rng = np.random.default_rng(seed)
    out = []
    covered = rule.variables(model)
    for variable, keep in zip(
        covered, rule.initial_keep_masks(covered, [None] * len(covered))
    ):
        weights = rng.standard_normal(keep.shape).astype(np.float32) * keep
        out.append((variable, tf.constant(weights), tf.constant(keep)))
    return out


@pytest.mark.parametrize("mode_name", ["eager", "graph", "jit"])
def test_rigl_grows_where_a_separately_computed_gradient_is_largest(mode_name):
    # A linear model with MSE: the gradient of the kernel is 2/n X^T (X W - Y).
    model = keras.Sequential(
        [keras.Input((12,)), keras.layers.Dense(8, use_bias=False)]
    )
    rule = sparse.RigL(0.75, t_end=1000, alpha=0.5, drop_fraction_anneal="constant")
    ((variable, weights, keep),) = _state(model, rule)
    rng = np.random.default_rng(1)
    x = rng.standard_normal((32, 12)).astype(np.float32)
    y = rng.standard_normal((32, 8)).astype(np.float32)
    with tf.GradientTape() as tape:
        w = tf.Variable(weights)
        loss = tf.reduce_mean(tf.square(x @ w - y), axis=0)
        loss = tf.reduce_sum(loss) / 8
    gradient = tape.gradient(loss, w)
    by_hand = 2 / (32 * 8) * x.T @ (x @ weights.numpy() - y)
    np.testing.assert_allclose(gradient.numpy(), by_hand, rtol=1e-4, atol=1e-6)

    def update(step, w, k, g):
        return rule.update(step, variable, w, k, gradient=g)

    if mode_name != "eager":
        update = tf.function(update, jit_compile=mode_name == "jit")
    result = update(tf.constant(99, tf.int64), weights, keep, gradient)
    keep = keep.numpy()
    count = int(np.float32(keep.sum()) * np.float32(0.5))
    assert int(result.count) == count
    grown = np.flatnonzero(result.grown.numpy())
    inactive = np.flatnonzero(~keep.ravel())
    best = inactive[np.argsort(-np.abs(by_hand.ravel()[inactive]), kind="stable")]
    np.testing.assert_array_equal(np.sort(grown), np.sort(best[:count]))
    dropped = np.flatnonzero(result.dropped.numpy())
    active = np.flatnonzero(keep.ravel())
    weakest = active[np.argsort(np.abs(weights.numpy().ravel()[active]), kind="stable")]
    np.testing.assert_array_equal(np.sort(dropped), np.sort(weakest[:count]))
    # Outside an update step nothing moves.
    idle = update(tf.constant(100, tf.int64), weights, tf.constant(keep), gradient)
    assert int(idle.count) == 0
    np.testing.assert_array_equal(idle.keep.numpy(), keep)


@pytest.mark.parametrize("mode_name", ["eager", "graph", "jit"])
def test_set_grows_set_scores_and_is_the_same_in_every_mode(mode_name):
    model = keras.Sequential(
        [keras.Input((12,)), keras.layers.Dense(16), keras.layers.Dense(4)]
    )
    rule = sparse.SET(0.9, t_end=1000, seed=11)
    state = _state(model, rule)
    keys = [e.key for e in rule.allocation(model)]

    def update(step):
        return [rule.update(step, v, w, k).keep for v, w, k in state]

    # SET moves after training step 200 at the start of step 201 (iterations 200).
    expected = [k.numpy() for k in update(tf.constant(200, tf.int64))]
    if mode_name != "eager":
        update = tf.function(update, jit_compile=mode_name == "jit")
    keeps = update(tf.constant(200, tf.int64))
    idle = update(tf.constant(199, tf.int64))
    fraction = rule.schedule.drop_fraction_at(200)
    for (_variable, _weights, keep), new, still, key in zip(state, keeps, idle, keys):
        new = new.numpy()
        np.testing.assert_array_equal(still, keep)
        assert new.sum() == keep.numpy().sum()
        moved = int(np.float32(keep.numpy().sum()) * np.float32(fraction))
        assert np.sum(new & ~keep.numpy()) == moved > 0
        scores = sparse.set_scores(keep.shape, 11, 200, sparse.variable_key(key))
        inactive = np.flatnonzero(~keep.numpy().ravel())
        best = inactive[np.argsort(-scores.numpy().ravel()[inactive], kind="stable")]
        np.testing.assert_array_equal(
            np.flatnonzero((new & ~keep.numpy()).ravel()), np.sort(best[:moved])
        )
    for a, b in zip(keeps, expected):
        np.testing.assert_array_equal(a.numpy(), b)


def test_set_runs_one_step_after_rigl_and_both_end_with_the_schedule():
    steps = tf.range(0, 1200, dtype=tf.int64)
    set_rule, rigl = (c(0.5, t_end=1000) for c in (sparse.SET, sparse.RigL))
    schedule = rigl.schedule.update_steps()
    assert np.flatnonzero(rigl.should_update(steps)).tolist() == schedule
    assert np.flatnonzero(set_rule.should_update(steps)).tolist() == [
        s + 1 for s in schedule
    ]
    assert (rigl.last_update_step(), set_rule.last_update_step()) == (899, 900)
    np.testing.assert_array_equal(
        set_rule.drop_fraction(steps[1:]), rigl.drop_fraction(steps[:-1])
    )


def test_keep_masks_is_update_per_variable_with_its_handle():
    model = _mlp()
    rule = sparse.SET(0.8, t_end=1000, drop_fraction_anneal="constant")
    state = _state(model, rule)
    variables, weights, keeps = zip(*state)
    handles = [v.value for v in variables]  # what the step passes
    together = rule.keep_masks(tf.constant(100), handles, weights, [None] * 3, keeps)
    for (v, w, k), keep in zip(state, together):
        np.testing.assert_array_equal(keep, rule.update(100, v, w, k).keep)
        assert not np.array_equal(keep, k)


def test_rigl_takes_embedding_gradients_as_indexed_slices():
    model = keras.Sequential(
        [keras.Input((3,), dtype="int32"), keras.layers.Embedding(20, 4)]
    )
    rule = sparse.RigL(0.5, t_end=1000, sparsity_distribution="uniform")
    ((variable, weights, keep),) = _state(model, rule)
    values = tf.ones((2, 4))
    gradient = tf.IndexedSlices(values, tf.constant([3, 5]), tf.constant([20, 4]))
    result = rule.update(tf.constant(99), variable, weights, keep, gradient=gradient)
    # Every inactive entry of the two rows with a gradient is grown first.
    inactive = ~keep.numpy()
    assert int(result.count) > inactive[[3, 5]].sum() > 0
    np.testing.assert_array_equal(result.grown.numpy()[[3, 5]], inactive[[3, 5]])


def test_rigl_without_a_gradient_names_the_variable():
    model = _mlp()
    rule = sparse.RigL(0.9, t_end=100)
    variable, weights, keep = _state(model, rule)[0]
    with pytest.raises(ValueError, match="'sequential/first/kernel' got no gradient"):
        rule.update(tf.constant(99), variable, weights, keep)


@pytest.mark.parametrize("rule_class", [sparse.SET, sparse.RigL])
def test_config_round_trips_through_keras_serialization(rule_class):
    rule = rule_class(
        0.95,
        t_end=7500,
        delta_t=50,
        alpha=0.5,
        drop_fraction_anneal="constant",
        begin_step=10,
        sparsity_distribution="erdos_renyi",
        dense_first_layer=True,
        custom_sparsity_map={"head": 0.5},
        erk_power_scale=0.5,
        seed=9,
    )
    serialized = keras.saving.serialize_keras_object(rule)
    assert serialized["registered_name"] == f"maskfit>{rule_class.__name__}"
    restored = keras.saving.deserialize_keras_object(json.loads(json.dumps(serialized)))
    assert restored == rule and type(restored) is rule_class
    assert restored != rule_class(0.95, t_end=7500)
    assert repr(rule_class(0.9, t_end=100, seed=2)) == (
        f"{rule_class.__name__}(sparsity=0.9, t_end=100, seed=2)"
    )


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (
            dict(sparsity=0.0),
            r"SET: sparsity must be a number in \(0, 1\).*sparsity=0.0",
        ),
        (dict(sparsity=1), r"Received: sparsity=1"),
        (dict(t_end=0), r"t_end must be a positive integer"),
        (dict(delta_t=-5), r"delta_t must be a positive integer"),
        (dict(alpha=2), r"alpha .*Received: alpha=2"),
        (dict(drop_fraction_anneal="linear"), r"'cosine' or 'constant'"),
        (dict(sparsity_distribution="ERK"), r"distribution must be one of"),
        (dict(dense_first_layer="yes"), r"dense_first_layer must be True or False"),
        (dict(custom_sparsity_map={1: 0.5}), r"keys must be layer names"),
        (dict(custom_sparsity_map={"a": 1.0}), r"custom_sparsity_map\['a'\]"),
        (dict(erk_power_scale=-1.0), r"erk_power_scale must be a positive"),
        (dict(seed=-3), r"seed must be a non-negative integer.*seed=-3"),
    ],
)
def test_constructor_refuses_bad_arguments(kwargs, message):
    arguments = dict(sparsity=0.9, t_end=1000)
    arguments.update(kwargs)
    with pytest.raises(ValueError, match=message):
        sparse.SET(**arguments)
