"""Rules that start sparse, read gradients and regrow entries, through `fit`."""

import keras
import numpy as np
import pytest

import maskfit
from maskfit import model as model_lib
from maskfit.optim import traits
from maskfit.spec import rules
from tests.helpers import step_rules


@keras.saving.register_keras_serializable(package="maskfit_tests")
class TinyRigL(step_rules.SwapAt):
    """Starts with the kernel's first row dropped; in step `at` drops the weakest
    kept entry and grows the dropped one with the largest gradient."""

    def __init__(self, at=2):
        super().__init__(at)

    def initial_keep_masks(self, variables, frozen):
        keep = np.ones(tuple(variables[0].shape), bool)
        keep[0] = False
        return [keep]

    def kept(self, weight, keep):
        return keep


class Record(keras.callbacks.Callback):
    def __init__(self, layer):
        super().__init__()
        self.layer = layer
        self.steps = []

    def on_train_batch_end(self, batch, logs=None):
        model = self.model
        keep = model_lib.keep_masks(model)[0]
        moments = [
            s.numpy() for s in traits.state_of(model.optimizer, self.layer.kernel)
        ]
        self.steps.append((keep.copy(), self.layer.kernel.numpy(), moments))


def test_a_rule_starts_sparse_updates_after_the_step_and_regrows_fresh(mode):
    keras.utils.set_random_seed(3)
    inputs = keras.Input((3,))
    body = keras.layers.Dense(4, name="body")
    model = maskfit.MaskedModel(inputs, keras.layers.Dense(2)(body(inputs)))
    rules.set_rule(body, TinyRigL(at=2))
    model.compile(
        optimizer=keras.optimizers.AdamW(0.1, weight_decay=0.1), loss="mse", **mode
    )
    rng = np.random.default_rng(0)
    x, y = (
        rng.normal(size=(20, 3)).astype("float32"),
        rng.normal(size=(20, 2)).astype("float32"),
    )
    record = Record(body)
    model.fit(x, y, batch_size=4, shuffle=False, verbose=0, callbacks=[record])
    keeps = [k for k, _, _ in record.steps]
    # Sparse from the start, as the initial mask says; updated once, in step 2.
    np.testing.assert_array_equal(keeps[0][0], np.zeros(4, bool))
    assert [int(k.sum()) for k in keeps] == [8] * 5
    np.testing.assert_array_equal(keeps[0], keeps[1])
    assert not np.array_equal(keeps[1], keeps[2])
    np.testing.assert_array_equal(keeps[2], keeps[4])
    grown = keeps[2] & ~keeps[1]
    dropped = keeps[1] & ~keeps[2]
    assert grown.sum() == dropped.sum() == 1
    for keep, kernel, _moments in record.steps:
        assert np.all(kernel[~keep] == 0)
    # Right after the update step a grown entry is 0, with fresh (0) moments;
    _, kernel, moments = record.steps[2]
    assert kernel[grown] == 0 and all(np.all(m[grown] == 0) for m in moments)
    # then it learns.
    assert record.steps[3][1][grown] != 0


def test_a_rule_that_returns_a_wrong_initial_mask_is_one_clear_error():
    class Wrong(TinyRigL):
        def initial_keep_masks(self, variables, frozen):
            return [np.ones((2, 2), bool)]

    inputs = keras.Input((3,))
    body = keras.layers.Dense(4, name="body")
    model = maskfit.MaskedModel(inputs, body(inputs))
    rules.set_rule(body, Wrong())
    model.compile(optimizer="adam", loss="mse")
    with pytest.raises(
        ValueError, match=r"initial_keep_masks returned a mask of shape \(2, 2\)"
    ):
        model.fit(np.ones((4, 3)), np.ones((4, 4)), verbose=0)
