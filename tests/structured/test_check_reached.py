"""The keras_hub gradient check keeps a bool mask of what the unzeroed gradients reach.

`hub/check.py` once held every gradient of the block with no unit zeroed
(float32, the size of the block's weights) for the whole check; it now
keeps `np.abs(g) > 1e-5 * scale` per variable (one byte per entry) and the
largest gradient. `_problem_before` below is the check as it was: both
must give the same verdicts (a passing coupling, a live path, a stray cut)
and `select_units` the same units.
"""

import numpy as np
import pytest

import maskfit.pruning as pruning
from maskfit.structured.hub import check as hub_check
from maskfit.structured.hub import couplings as couplings_hub
from tests.helpers import hub_cases

keras_hub = pytest.importorskip("keras_hub", reason="needs the hub extra")

_SPEC = couplings_hub.SPECS["LlamaTransformerDecoder"]
_HEADS = _SPEC.attention.head_axes
# Each coupling and the verdict of its (heads, units) spaces.
_COUPLINGS = {
    "right": (_SPEC, (None, None)),
    # The FFN's up projection left out: zeroing a unit cuts entries off.
    "up_left_out": (
        _SPEC._replace(ffn_in=(("feedforward_gate_dense",),)),
        (None, "cut"),
    ),
    # The output projection's rows left out: a zeroed head still reaches it.
    "output_left_out": (
        _SPEC._replace(
            attention=_SPEC.attention._replace(
                head_axes={k: v for k, v in _HEADS.items() if k != "attention_output"}
            )
        ),
        ("live", None),
    ),
    # The value columns left out: zeroing a head cuts them off.
    "value_left_out": (
        _SPEC._replace(
            attention=_SPEC.attention._replace(
                head_axes={k: v for k, v in _HEADS.items() if k != "value"}
            )
        ),
        ("cut", None),
    ),
}


def _problem_before(
    layer, x, arrays, space, sliced, node, before, seed, described=None
):
    """The check before the bool mask: `before` holds the whole gradients."""
    index_of = {id(v): i for i, v in enumerate(layer.weights)}
    zeroed = [(v, axis, np.flatnonzero(ids == node)) for v, axis, ids, _ in sliced]
    after = hub_check._gradients(layer, x, arrays, zeroed, seed, described)
    scale = max(float(np.max(np.abs(g))) for g in before.values())
    declared = {}
    unit = node - space.first
    for (variable, axis, positions), (*_, closes) in zip(zeroed, sliced):
        taken = np.take(after[id(variable)], positions, axis=axis)
        if not closes and np.any(np.abs(taken) > 1e-6 * scale):
            return ("live", unit, index_of[id(variable)])
        mark = np.zeros(after[id(variable)].shape, bool)
        index = [slice(None)] * mark.ndim
        index[axis] = positions
        mark[tuple(index)] = True
        declared[id(variable)] = declared.get(id(variable), False) | mark
    for variable in layer.weights:
        cut = (np.abs(before[id(variable)]) > 1e-5 * scale) & (after[id(variable)] == 0)
        if np.any(cut & ~declared.get(id(variable), False)):
            return ("cut", unit, index_of[id(variable)])
    return None


def _select(monkeypatch, model):
    """`select_units(model, 0.5)` and the verdicts its check gave."""
    verdicts = []
    original = hub_check._verdicts

    def recorded(*args, **kwargs):
        verdicts.append(original(*args, **kwargs))
        return verdicts[-1]

    monkeypatch.setattr(hub_check, "_verdicts", recorded)
    selection = pruning.select_units(model, 0.5)
    monkeypatch.setattr(hub_check, "_verdicts", original)
    return selection, verdicts


@pytest.mark.backends("tensorflow", "jax")
@pytest.mark.parametrize("name", sorted(_COUPLINGS))
def test_the_bool_mask_gives_the_verdicts_and_units_of_the_whole_gradients(
    monkeypatch, name
):
    spec, expected = _COUPLINGS[name]
    monkeypatch.setitem(couplings_hub.SPECS, "LlamaTransformerDecoder", spec)
    model = hub_cases.backbone("llama", num_layers=2)
    selection, verdicts = _select(monkeypatch, model)
    assert [[v and v[0] for v in each] for each in verdicts] == [list(expected)]

    with monkeypatch.context() as before:
        before.setattr(hub_check, "_reached", lambda gradients: gradients)
        before.setattr(hub_check, "_problem", _problem_before)
        selection_before, verdicts_before = _select(before, model)
    assert verdicts == verdicts_before
    np.testing.assert_array_equal(selection.kept, selection_before.kept)
    assert selection.removed() == selection_before.removed()
    assert selection.graph.explain() == selection_before.graph.explain()
