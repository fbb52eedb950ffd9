"""Frozen entries stay exact under `keras.optimizers.MultiOptimizer` (Keras 3.15+).

The exactness matrix's check (`test_exactness.train_and_check`) with the head on
AdamW and the hidden layer on SGD with Nesterov momentum, weight decay on both.
"""

import keras
import pytest

from tests.step.test_exactness import train_and_check

pytestmark = pytest.mark.skipif(
    not hasattr(keras.optimizers, "MultiOptimizer"),
    reason=f"Keras {keras.__version__} has no keras.optimizers.MultiOptimizer (3.15+)",
)


def multi_optimizer(**head_settings):
    return keras.optimizers.MultiOptimizer(
        keras.optimizers.OptimizerMap(
            keras.optimizers.SGD(0.1, momentum=0.9, nesterov=True, weight_decay=0.1),
            {
                "head/.*": keras.optimizers.AdamW(
                    0.05, weight_decay=0.1, **head_settings
                )
            },
        )
    )


def test_frozen_entries_hold_under_a_multi_optimizer(mode):
    train_and_check(multi_optimizer(), mode)


def test_frozen_entries_hold_under_a_sub_optimizer_with_ema_overwrite(mode):
    # optim.traits.ema_averages reads every optimizer within, a
    # MultiOptimizer's sub-optimizers too.
    train_and_check(multi_optimizer(use_ema=True, ema_overwrite_frequency=3), mode)
