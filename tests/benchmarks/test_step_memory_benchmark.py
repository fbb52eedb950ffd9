"""`benchmarks.scale.step_memory`: its config, its cases and its table.

Its measurement is run by `tests/step/test_step_memory.py`.
"""

import pytest

from benchmarks.scale import step_memory


def test_every_model_and_optimizer_gets_a_stock_and_a_masked_process():
    config = step_memory.Config(models=("mlp", "tiny"), optimizers=("sgd",), steps=3)
    found = step_memory.cases(config)
    assert [c[:3] for c in found] == [
        ("mlp", "sgd", "stock"),
        ("mlp", "sgd", "masked"),
        ("tiny", "sgd", "stock"),
        ("tiny", "sgd", "masked"),
    ]
    assert found[0][3]["mlp_width"] == config.mlp_width
    assert found[2][3]["size"]["name"] == "tiny"
    assert all(c[3]["steps"] == 3 for c in found)


@pytest.mark.parametrize(
    "fields, message",
    [
        (dict(models=("mlp", "2B")), "Config models must name"),
        (dict(optimizers=("adam",)), "Config optimizers must be"),
        (dict(steps=1), "Config steps must be >= 2"),
    ],
)
def test_a_bad_config_is_refused(fields, message):
    with pytest.raises(ValueError, match=message):
        step_memory.Config(**fields)


def test_the_table_shows_what_the_masked_step_adds_over_stock():
    mb = 2**20
    row = dict(model="mlp", optimizer="sgd", weights_bytes=256 * mb)
    row |= dict(stock_first=100 * mb, masked_first=164 * mb)
    row |= dict(stock_later=50 * mb, masked_later=None)
    lines = step_memory.format_table([row]).splitlines()
    assert lines[2] == (
        "| mlp | sgd | 256 | 100 | 164 | 64 (0.25x weights) | 50 | - | - |"
    )
