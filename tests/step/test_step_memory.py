"""The masked TensorFlow graph step holds no float32 per parameter more than stock's.

Issue 43: an XLA call taking every masked gradient at once, and every mask's
float copy cast at the start of the step, made a masked `train_on_batch`
hold about one float32 per parameter more than stock Keras's.
`benchmarks.scale.step_memory` measures it; here both contenders run in one
fresh process (the masked one first) on 16 `Dense(1024)` layers (64 MB of
kernels, a fused update, plain SGD), whose 16 gradients stock Keras applies and frees one by one, so that
holding all of them shows far above the measurement's noise (a few MB).
Slow: its process imports Keras afresh (9-10 s of the ~30 s it takes on this
loaded 2-core machine).
"""

import pytest

from benchmarks.scale import step_memory

_CASE = dict(
    model="mlp",
    mlp_depth=16,
    mlp_width=1024,
    mlp_batch=32,
    classes=10,
    optimizer="sgd",
    steps=4,
)


def _measure_both():
    """`{contender: measure_case result}`, masked first, in one process."""
    names = step_memory.CONTENDERS[::-1]
    found = step_memory.in_subprocess([dict(_CASE, contender=n) for n in names])
    return dict(zip(names, found))


@pytest.mark.slow
def test_the_masked_step_peaks_at_stock_keras_memory():
    found = _measure_both()
    stock, masked = found["stock"], found["masked"]
    weights = masked["weights_bytes"]
    assert weights == stock["weights_bytes"] > 64 * 2**20
    report = {
        name: {k: round(v / 2**20, 1) for k, v in result.items()}
        for name, result in found.items()
    }
    # Stock's first step gains from the runtime the masked one warmed up.
    # Measured on 2026-12-06: later steps +0.06x the weights, the first
    # +0.66x; before the fix, +0.75x and +2.2x.
    assert masked["later"] <= stock["later"] + 0.25 * weights, report
    assert masked["first"] <= stock["first"] + 1.0 * weights, report
