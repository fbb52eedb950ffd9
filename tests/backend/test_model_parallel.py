"""Masks laid out like their variables under `keras.distribution.ModelParallel`.

JAX, 8 virtual CPU devices in a 2x4 mesh (`batch` x `model`), in a
subprocess (tests/helpers/model_parallel_run.py): a Dense model split by a
hand `LayoutMap` with an `ElementMask`, a `PiecewiseMask` of learning-rate
multipliers, magnitude pruning and an `OutputMask` (fast); a tiny keras_hub
Llama split by `LlamaBackbone.get_layout_map` (slow). Checked from the saved
arrays: each device's shard of a mask covers exactly the entries of its
shard of the variable (a broadcast dimension whole), frozen entries are bit
for bit as before on every shard, pruned ones 0, and `maskfit.mask_memory`
reports each device's shard of the mask, not the whole.
"""

import subprocess
import sys

import numpy as np
import pytest

pytestmark = pytest.mark.backends("jax")

from tests.helpers import checkout, model_parallel_run


def _run(kind, tmp_path_factory):
    out = str(tmp_path_factory.mktemp(f"model_parallel_{kind}") / "run.npz")
    env = checkout.env(
        KERAS_BACKEND="jax",
        TF_CPP_MIN_LOG_LEVEL="2",
        XLA_FLAGS="--xla_force_host_platform_device_count=8",
    )
    result = subprocess.run(
        [sys.executable, model_parallel_run.__file__, kind, out],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout + result.stderr[-4000:]
    assert f"model parallel ({kind}): ok on 8 devices" in result.stdout
    with np.load(out) as saved:
        return {k: saved[k] for k in saved.files}


@pytest.fixture(scope="module")
def mlp(tmp_path_factory):
    return _run("mlp", tmp_path_factory)


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    return _run("llama", tmp_path_factory)


def _keys(run):
    return sorted(k.split(":", 1)[1] for k in run if k.startswith("frozen:"))


def _devices(run, name, key):
    found = {
        int(k.rsplit(":", 1)[1]): run[k] for k in run if k.startswith(f"{name}:{key}:")
    }
    assert len(found) == 8, (name, key, sorted(found))
    return found


def misplaced(run, key, mask_index):
    """The devices whose shard of the mask is not the one of their variable shard.

    A mask dimension of the variable's size must cover the variable shard's
    entries; a broadcast one (size 1) and the schedule's intervals, all.
    """
    table_shape = run[f"table_shape:{key}"]
    wrong = []
    for device, variable in _devices(run, "vindex", key).items():
        rank = len(table_shape) - 1
        expected = [[0, table_shape[0]]]
        for (start, stop), size in zip(
            variable[len(variable) - rank :], table_shape[1:]
        ):
            expected.append([start, stop] if size > 1 else [0, 1])
        if not np.array_equal(mask_index[device], np.array(expected)):
            wrong.append(device)
    return wrong


def _check_layouts(run):
    for key in _keys(run):
        assert misplaced(run, key, _devices(run, "mindex", key)) == [], key


def _check_frozen(run):
    for key in _keys(run):
        frozen = run[f"frozen:{key}"]
        before, after = _devices(run, "before", key), _devices(run, "after", key)
        for device, index in _devices(run, "vindex", key).items():
            where = tuple(slice(a, b) for a, b in index)
            held = frozen[where]
            np.testing.assert_array_equal(
                after[device][held], before[device][held], err_msg=f"{key} on {device}"
            )
            assert np.any(after[device][~held] != before[device][~held]), (key, device)
            if f"zero:{key}" in run:
                zero = run[f"zero:{key}"][where]
                assert zero.any(), (key, device)
                np.testing.assert_array_equal(after[device][zero], 0.0)
    assert np.all(np.isfinite(run["losses"]))


def test_each_mask_is_sharded_like_its_variable(mlp):
    _check_layouts(mlp)


def test_stateless_masks_are_sharded_like_their_variables(mlp):
    # `maskfit.stateless_masks`, for a user's own jit loop: declared masks only.
    keys = [k for k in _keys(mlp) if f"sindex:{k}:0" in mlp]
    assert len(keys) == len(_keys(mlp)) - 1  # all but the pruned kernel
    for key in keys:
        assert misplaced(mlp, key, _devices(mlp, "sindex", key)) == [], key


def test_the_layout_check_fails_on_a_replicated_mask(mlp):
    # A kernel split over `model` with a full-shape mask: replicated, every
    # device would hold the whole mask, and the check must say so.
    for key in ("up__kernel", "mid__kernel", "pruned__kernel"):
        assert len(misplaced(mlp, key, _devices(mlp, "replicated", key))) == 8, key
    # A broadcast (per column) mask is replicated by design: nothing to split.
    assert misplaced(mlp, "head__bias", _devices(mlp, "replicated", "head__bias")) == []


def test_frozen_entries_hold_on_every_shard(mlp):
    _check_frozen(mlp)


def test_a_mask_set_mid_fit_reaches_the_step_laid_out(mlp):
    # Set in a callback while `fit` holds the variables' values: placed from
    # the state's shardings (test_each_mask_is_sharded_like_its_variable).
    np.testing.assert_array_equal(mlp["given:up__kernel"], mlp["last:up__kernel"])
    assert not mlp["last:up__kernel"].all()


def test_mask_memory_is_each_devices_shard(mlp):
    # 16x32 float32 kernel split 4 ways; its mask as booleans: a quarter of
    # the shard on every device (the whole mask would be 512 bytes).
    for device in range(8):
        assert mlp[f"variable_bytes:up__kernel:{device}"] == 16 * 8 * 4
        assert mlp[f"mask_bytes:up__kernel:{device}"] == 16 * 8
        # Two intervals of float32 multipliers, plus one int32 boundary.
        assert mlp[f"mask_bytes:mid__kernel:{device}"] == 2 * 8 * 32 * 4 + 4
        assert mlp[f"mask_bytes:pruned__kernel:{device}"] == 32 * 8


# CI's slow leg runs under TensorFlow; the run is a JAX subprocess either way.
@pytest.mark.slow
@pytest.mark.backends("tensorflow", "jax")
def test_llama_masks_follow_its_layout_map(llama):
    keys = _keys(llama)
    assert len(keys) == 4, keys
    _check_layouts(llama)
    _check_frozen(llama)
    query = next(k for k in keys if "query" in k)
    for device in range(8):
        shard = llama[f"variable_bytes:{query}:{device}"]
        assert llama[f"mask_bytes:{query}:{device}"] * 4 == shard
