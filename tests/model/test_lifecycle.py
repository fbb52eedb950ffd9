"""Masks over a model's life: schedules, save and load, weights-only checkpoints, inference."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import maskfit


def small_model(model_cls=maskfit.MaskedModel, seed=5):
    keras.utils.set_random_seed(seed)
    inputs = keras.Input((3,), name="x")
    body = keras.layers.Dense(4, activation="tanh", name="body")
    head = keras.layers.Dense(2, name="head")
    return model_cls(inputs, head(body(inputs))), body, head


def batches(n=12, seed=0):
    rng = np.random.default_rng(seed)
    return (
        rng.normal(size=(n, 3)).astype("float32"),
        rng.normal(size=(n, 2)).astype("float32") * 2,
    )


# ---------------------------------------------------------------- schedules


def scheduled_run(boundary, mode, steps_per_execution):
    model, body, head = small_model()
    schedule = maskfit.PiecewiseMask(
        [boundary], [maskfit.OutputMask([0, 0, 0, 0]), maskfit.OutputMask([1, 0, 1, 1])]
    )
    maskfit.set_mask(body, schedule)
    model.compile(
        optimizer=keras.optimizers.Adam(0.05),
        loss="mse",
        steps_per_execution=steps_per_execution,
        **mode,
    )
    x, y = batches()
    model.fit(x, y, batch_size=2, epochs=1, shuffle=False, verbose=0)  # 6 steps
    return model


def switched_by_hand(boundary):
    model, body, _ = small_model()
    maskfit.set_mask(body, maskfit.OutputMask([0, 0, 0, 0]))
    model.compile(optimizer=keras.optimizers.Adam(0.05), loss="mse")
    x, y = batches()
    model.fit(
        x[: 2 * boundary], y[: 2 * boundary], batch_size=2, shuffle=False, verbose=0
    )
    maskfit.set_mask(body, maskfit.OutputMask([1, 0, 1, 1]))
    model.fit(
        x[2 * boundary :], y[2 * boundary :], batch_size=2, shuffle=False, verbose=0
    )
    return model


@pytest.mark.parametrize("steps_per_execution", [1, 4])
def test_schedule_switches_at_the_exact_step(mode, steps_per_execution):
    # With 4 steps per execution the switch at step 3 falls inside one execution.
    scheduled = scheduled_run(3, mode, steps_per_execution)
    by_hand = switched_by_hand(3)
    for a, b in zip(scheduled.weights, by_hand.weights):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-6, atol=1e-7)
    off_by_one = switched_by_hand(4)
    assert not np.allclose(
        scheduled.get_layer("body").kernel.numpy(),
        off_by_one.get_layer("body").kernel.numpy(),
        rtol=1e-6,
        atol=1e-7,
    )
    # Unit 1 is frozen in every interval: bit-identical after all of it.
    initial, _, _ = small_model()
    np.testing.assert_array_equal(
        scheduled.get_layer("body").kernel.numpy()[:, 1],
        initial.get_layer("body").kernel.numpy()[:, 1],
    )


class TraceCounter(maskfit.MaskedModel):
    traces = 0

    def train_step(self, data):
        TraceCounter.traces += 1
        return super().train_step(data)


def test_schedule_runs_without_callbacks_and_retraces_only_where_freezing_changes():
    model, body, _ = small_model(TraceCounter)
    maskfit.set_mask(
        body,
        maskfit.PiecewiseMask(
            [2, 4, 6],
            [
                maskfit.OutputMask([0] * 4),
                maskfit.OutputMask([1, 1, 0, 0]),
                maskfit.OutputMask([1] * 4),
                maskfit.OutputMask([0, 1, 1, 0]),
            ],
        ),
    )
    model.compile(optimizer="adamw", loss="mse", jit_compile=True)
    x, y = batches()
    TraceCounter.traces = 0
    kernel = body.kernel.numpy()
    model.fit(x[:4], y[:4], batch_size=2, verbose=0)  # steps 0, 1: all frozen
    np.testing.assert_array_equal(body.kernel.numpy(), kernel)
    traces = TraceCounter.traces
    # Step 2 turns the fully frozen body learnable: one retrace, as for
    # trainable=False -> True, and no more for the other boundaries.
    model.fit(x[:4], y[:4], batch_size=2, verbose=0)  # steps 2, 3: units 0, 1
    assert TraceCounter.traces == traces + 1
    np.testing.assert_array_equal(body.kernel.numpy()[:, 2:], kernel[:, 2:])
    assert np.all(body.kernel.numpy()[:, :2] != kernel[:, :2])
    kernel = body.kernel.numpy()
    model.fit(x[:8], y[:8], batch_size=2, verbose=0)  # steps 4-7: all, then 1, 2
    assert TraceCounter.traces == traces + 1
    assert np.all(body.kernel.numpy() != kernel)


@pytest.mark.parametrize(
    "make, error, words",
    [
        (
            lambda: maskfit.PiecewiseMask([], [maskfit.OutputMask([1])]),
            ValueError,
            ["increasing positive"],
        ),
        (
            lambda: maskfit.PiecewiseMask([5, 5], [maskfit.OutputMask([1])] * 3),
            ValueError,
            ["[5, 5]"],
        ),
        (
            lambda: maskfit.PiecewiseMask([0], [maskfit.OutputMask([1])] * 2),
            ValueError,
            ["positive"],
        ),
        (
            lambda: maskfit.PiecewiseMask([1.5], [maskfit.OutputMask([1])] * 2),
            ValueError,
            ["integers"],
        ),
        (
            lambda: maskfit.PiecewiseMask([10], [maskfit.OutputMask([1])]),
            ValueError,
            ["1 boundaries make 2 intervals", "1 specs"],
        ),
        (
            lambda: maskfit.PiecewiseMask(
                [10], [maskfit.OutputMask([1]), maskfit.OutputMask([1, 0])]
            ),
            ValueError,
            ["specs[1]", "1", "2"],
        ),
        (
            lambda: maskfit.PiecewiseMask(
                [10], [maskfit.OutputMask([1]), maskfit.ElementMask({"kernel": [1]})]
            ),
            ValueError,
            ["one kind"],
        ),
        (
            lambda: maskfit.PiecewiseMask([10], [maskfit.OutputMask([1]), [1]]),
            TypeError,
            ["specs[1]=[1]"],
        ),
    ],
)
def test_bad_schedules_fail_at_construction(make, error, words):
    with pytest.raises(error) as info:
        make()
    for word in words:
        assert word in str(info.value)


def test_schedule_specs_are_checked_against_the_layer_at_set_mask():
    layer = keras.layers.Dense(2, name="d")
    schedule = maskfit.PiecewiseMask([3], [maskfit.OutputMask([1, 0, 1])] * 2)
    with pytest.raises(ValueError, match=r"'d' has 3 values .* 2 output units"):
        maskfit.set_mask(layer, schedule)


# ------------------------------------------------------------ save and load


def declare_all_kinds(model):
    maskfit.set_mask(model.get_layer("head"), maskfit.OutputMask([1, 0], backprop=True))
    maskfit.set_mask(
        model.get_layer("body"),
        maskfit.PiecewiseMask(
            [3],
            [
                maskfit.ElementMask({"kernel": np.eye(3, 4)}),
                maskfit.ElementMask({"kernel": 1 - np.eye(3, 4)}),
            ],
        ),
    )


def assert_same_masks(a, b):
    for name in ("head", "body"):
        assert maskfit.get_mask(a.get_layer(name)) == maskfit.get_mask(
            b.get_layer(name)
        )


def test_functional_save_load_restores_masks_schedules_and_optimizer(tmp_path):
    model, _, _ = small_model()
    declare_all_kinds(model)
    model.compile(optimizer=keras.optimizers.AdamW(0.05), loss="mse")
    x, y = batches()
    model.fit(x, y, batch_size=4, verbose=0)  # 3 steps: the schedule switched
    model.save(tmp_path / "m.keras")
    loaded = keras.models.load_model(
        tmp_path / "m.keras"
    )  # safe_mode, no custom_objects

    assert type(loaded).__name__ == "MaskedModel"
    assert_same_masks(model, loaded)
    assert int(loaded.optimizer.iterations.numpy()) == 3
    for a, b in zip(model.optimizer.variables, loaded.optimizer.variables):
        np.testing.assert_array_equal(a.numpy(), b.numpy())

    frozen_head = loaded.get_layer("head").kernel.numpy()[:, 1]
    frozen_body = loaded.get_layer("body").kernel.numpy()[np.eye(3, 4) == 1]
    model.fit(x, y, batch_size=4, verbose=0)
    loaded.fit(x, y, batch_size=4, verbose=0)
    for a, b in zip(model.weights, loaded.weights):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    np.testing.assert_array_equal(
        loaded.get_layer("head").kernel.numpy()[:, 1], frozen_head
    )
    np.testing.assert_array_equal(
        loaded.get_layer("body").kernel.numpy()[np.eye(3, 4) == 1], frozen_body
    )


@keras.saving.register_keras_serializable(package="maskfit_tests")
class Tower(maskfit.MaskedModel):
    def __init__(self, width=4, **kwargs):
        super().__init__(**kwargs)
        self.width = width
        self.body = keras.layers.Dense(width, activation="tanh", name="body")
        self.head = keras.layers.Dense(2, name="head")

    def call(self, x):
        return self.head(self.body(x))

    def get_config(self):
        return {**super().get_config(), "width": self.width}


def test_subclassed_save_load_restores_masks_and_trains_on_exactly(tmp_path):
    model = Tower()
    x, y = batches()
    model(x)
    declare_all_kinds(model)
    model.compile(optimizer=keras.optimizers.Lion(0.01, weight_decay=0.1), loss="mse")
    model.fit(x, y, batch_size=4, verbose=0)
    model.save(tmp_path / "tower.keras")
    loaded = keras.models.load_model(tmp_path / "tower.keras")

    assert isinstance(loaded, Tower) and loaded.width == 4
    assert_same_masks(model, loaded)
    model.fit(x, y, batch_size=4, verbose=0)
    loaded.fit(x, y, batch_size=4, verbose=0)
    for a, b in zip(model.weights, loaded.weights):
        np.testing.assert_array_equal(a.numpy(), b.numpy())


def test_a_saved_mask_that_does_not_fit_fails_on_load_and_sets_nothing():
    model, body, head = small_model()
    maskfit.set_mask(head, maskfit.OutputMask([1, 0]))
    config = keras.saving.serialize_keras_object(model)
    config["config"]["grad_masks"]["body"] = keras.saving.serialize_keras_object(
        maskfit.OutputMask([1, 0, 1])
    )
    with pytest.raises(
        ValueError, match=r"saved gradient mask of layer 'body'.*3 values"
    ):
        keras.saving.deserialize_keras_object(config)
    config["config"]["grad_masks"] = {"bdy": config["config"]["grad_masks"]["head"]}
    with pytest.raises(ValueError, match=r"'bdy'.*Did you mean 'body'"):
        keras.saving.deserialize_keras_object(config)


def test_config_round_trip_keeps_every_spec():
    model, body, head = small_model()
    declare_all_kinds(model)
    clone = maskfit.MaskedModel.from_config(model.get_config())
    assert_same_masks(model, clone)
    assert clone.get_config()["grad_masks"] == model.get_config()["grad_masks"]


def test_weights_only_checkpoints_keep_the_current_masks(tmp_path):
    model, body, head = small_model()
    maskfit.set_mask(head, maskfit.OutputMask([1, 0]))
    model.compile(optimizer="adam", loss="mse")
    x, y = batches()
    checkpoint = keras.callbacks.ModelCheckpoint(
        tmp_path / "w.weights.h5", save_weights_only=True
    )
    model.fit(x, y, batch_size=4, verbose=0, callbacks=[checkpoint])
    maskfit.set_mask(head, maskfit.OutputMask([0, 1]))
    model.load_weights(tmp_path / "w.weights.h5")
    assert maskfit.get_mask(head) == maskfit.OutputMask([0, 1])
    kernel = head.kernel.numpy()
    model.fit(x, y, batch_size=4, verbose=0)
    np.testing.assert_array_equal(head.kernel.numpy()[:, 0], kernel[:, 0])


# ---------------------------------------------------------------- inference


def test_inference_matches_a_plain_keras_model_with_the_same_weights(tmp_path):
    model, body, head = small_model()
    declare_all_kinds(model)
    model.compile(optimizer="adam", loss="mse", metrics=["mae"])
    x, y = batches()
    model.fit(x, y, batch_size=4, verbose=0)
    plain, _, _ = small_model(keras.Model)
    plain.set_weights(model.get_weights())
    plain.compile(optimizer="adam", loss="mse", metrics=["mae"])

    for a, b in zip(model.weights, plain.weights):
        np.testing.assert_array_equal(a.numpy(), b.numpy())  # Stored weights: bits.
    # MaskedModel's graph (with the backprop gate's identity) vs keras.Model's:
    # two computations, so float32 closeness, not bits.
    np.testing.assert_allclose(
        model.predict(x, verbose=0), plain.predict(x, verbose=0), rtol=1e-6, atol=1e-7
    )
    np.testing.assert_allclose(
        model.evaluate(x, y, verbose=0), plain.evaluate(x, y, verbose=0), rtol=1e-6
    )
    model.export(tmp_path / "exported", verbose=False)
    reloaded = tf.saved_model.load(str(tmp_path / "exported"))
    np.testing.assert_allclose(
        reloaded.serve(x).numpy(), plain.predict(x, verbose=0), rtol=1e-6
    )
