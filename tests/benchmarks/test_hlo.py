"""`benchmarks.hlo`: counting an optimized HLO module's kernels and bytes."""

import pytest

from benchmarks import hlo

pytestmark = pytest.mark.backends("tensorflow", "jax")

_MODULE = """HloModule jit_step, is_scheduled=true, entry_computation_layout={(f32[8]{0})->f32[8]{0}}

%fused_computation (param_0: f32[8], param_1: pred[8]) -> f32[8] {
  %param_0 = f32[8]{0} parameter(0)
  ROOT %negate = f32[8]{0} negate(f32[8]{0} %param_0)
}

%body (state: (s32[], f32[8])) -> (s32[], f32[8]) {
  %state = (s32[], f32[8]{0}) parameter(0)
  %i = s32[] get-tuple-element((s32[], f32[8]{0}) %state), index=0
  %v = f32[8]{0} get-tuple-element((s32[], f32[8]{0}) %state), index=1
  %n = f32[8]{0} fusion(f32[8]{0} %v), kind=kLoop, calls=%fused_computation
  ROOT %t = (s32[], f32[8]{0}) tuple(s32[] %i, f32[8]{0} %n)
}

%cond (state.1: (s32[], f32[8])) -> pred[] {
  %state.1 = (s32[], f32[8]{0}) parameter(0)
  ROOT %c = pred[] constant(true)
}

ENTRY %main.1 (p0: f32[8], p1: pred[8]) -> f32[8] {
  %p0 = f32[8]{0} parameter(0)
  %p1 = pred[8]{0} parameter(1)
  %copy = f32[8]{0} copy(%p0)
  %sel = f32[8]{0} fusion(%copy, %p1), kind=kLoop, calls=%fused_computation
  %zero = s32[] constant(0)
  %init = (s32[], f32[8]{0}) tuple(%zero, %sel)
  %loop = (s32[], f32[8]{0}) while(%init), condition=%cond, body=%body
  ROOT %out = f32[8]{0} get-tuple-element(%loop), index=1
}
"""


def test_counts_kernels_and_their_bytes_in_entry_and_loop_bodies():
    counts = hlo.hlo_counts(_MODULE)

    # copy (32 read + 32 written), the entry's fusion (32 + 8 read, 32
    # written), the loop body's fusion (32 + 32); not parameters,
    # constants, tuples or the fused computation's own instructions.
    assert counts == {"fusions": 2, "kernels": 3, "bytes_accessed": 200.0}


def test_refuses_text_without_an_entry_computation():
    with pytest.raises(ValueError, match="no ENTRY"):
        hlo.hlo_counts("HloModule m\n")


def test_row_gives_ratios_to_stock_and_cells_dash_without_counts():
    stock = {"fusions": 10, "kernels": 12, "bytes_accessed": 1000.0}
    masked = {"fusions": 10, "kernels": 12, "bytes_accessed": 1043.0}

    row = hlo.row(masked, stock)
    assert list(row) == list(hlo.COLUMNS)
    assert row["fusions_ratio"] == row["kernels_ratio"] == 1.0
    assert row["bytes_ratio"] == pytest.approx(1.043)
    assert len(hlo.cells(row)) == len(hlo.HEADER)
    empty = hlo.row(None, stock)
    assert set(empty.values()) == {None}
    assert hlo.cells(empty).split() == ["-"] * 5
