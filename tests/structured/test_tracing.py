"""MACs counted from the backend's trace of a call (`maskfit.structured.tracing`)."""

import keras
import pytest
from keras import layers as L
from keras import ops

import maskfit.pruning as pruning
from maskfit.structured import tracing

pytestmark = pytest.mark.backends("tensorflow", "jax")


class Mixer(keras.layers.Layer):
    """A layer maskfit has no record for: a per-head einsum and a scores product."""

    def build(self, shape):
        self.w = self.add_weight(shape=(shape[-1], 2, 3), name="w")

    def call(self, x):
        heads = ops.einsum("btd,dhk->bthk", x, self.w)  # t d h k
        return ops.einsum("bshk,bthk->bhst", heads, heads)  # h s t k


class Looped(keras.layers.Layer):
    def build(self, shape):
        self.w = self.add_weight(shape=(shape[-1], shape[-1]), name="w")

    def call(self, x):
        return ops.fori_loop(0, 3, lambda i, h: ops.matmul(h, self.w), x)


class Opaque(keras.layers.Layer):
    def call(self, x):
        return x * float(ops.convert_to_numpy(ops.sum(x)))  # needs a value

    def compute_output_shape(self, shape):
        return shape


def test_a_layer_without_a_record_is_traced_with_its_ops_between():
    x = keras.Input((None, 4))
    mixed = Mixer(name="mixer")(x)
    y = ops.matmul(mixed, ops.ones((5, 7)))  # a keras.ops call in the graph
    model = keras.Model(x, y)
    report = pruning.size_report(model, model, unknown_size=5)
    rows = {r.kind: r.macs_before for r in report.rows}
    # t=5 tokens: 5*4*(2*3) for the heads, 2*5*5*3 for the scores.
    assert rows["Mixer"] == 5 * 4 * 6 + 2 * 5 * 5 * 3 == 270
    assert rows["Matmul"] == 2 * 5 * 7 * 5 == 350  # (2, 5, 5) @ (5, 7)
    assert report.notes == ()


def test_a_convolution_traced_counts_as_its_record():
    x = keras.Input((5, 7, 5))
    model = keras.Model(x, L.Conv2D(2, 3, name="conv")(x))
    (row,) = pruning.size_report(model, model).rows
    # 3x5 positions of 2 filters, each over 3x3x5 inputs.
    assert row.macs_before == 3 * 5 * 2 * (3 * 3 * 5)
    traced = tracing.traced_macs(model.get_layer("conv"), (x,), {})
    assert traced == tracing.Traced(row.macs_before)


def test_a_depthwise_convolution_counts_each_channel_once():
    x = keras.Input((6, 6, 4))
    layer = L.DepthwiseConv2D(3, depth_multiplier=2)
    layer(x)
    # Output 4x4 positions x 8 channels, each from a 3x3 window of one channel.
    assert tracing.traced_macs(layer, (x,), {}).macs == 4 * 4 * 8 * 9


def test_a_loop_counts_as_far_as_the_trace_says():
    x = keras.Input((4,))
    model = keras.Model(x, Looped(name="looped")(x))
    report = pruning.size_report(model, model)
    if keras.backend.backend() == "jax":
        # A fori_loop with static bounds is a scan of length 3.
        assert (report.macs_before, report.notes) == (3 * 16, ())
    else:
        # TensorFlow's while loop does not state its trip count: once, said.
        assert report.macs_before == 16
        assert report.notes == (
            (
                "looped",
                "a loop whose trip count the trace does not state counts its body once",
            ),
        )
        assert "looped: MACs a loop whose trip count" in str(report)


def test_a_call_that_cannot_be_traced_counts_zero_and_says_why():
    x = keras.Input((4,))
    model = keras.Model(x, L.Dense(3, name="head")(Opaque(name="opaque")(x)))
    report = pruning.size_report(model, model)
    assert report.macs_before == 12  # the Dense's record
    ((name, note),) = report.notes
    assert name == "opaque" and note.startswith("could not be traced (")


def test_hlo_text_with_calls_conditionals_and_convolutions():
    hlo = """HloModule m

%then (p: f32[2,3]) -> f32[2,5] {
  %p = f32[2,3]{1,0} parameter(0)
  %w = f32[3,5]{1,0} constant({...})
  ROOT %d = f32[2,5]{1,0} dot(f32[2,3]{1,0} %p, f32[3,5]{1,0} %w), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}

%else (q: f32[2,3]) -> f32[2,5] {
  ROOT %b = f32[2,5]{1,0} broadcast(f32[] %c), dimensions={}
}

ENTRY %main (x: f32[1,8,8,3], k: f32[3,3,3,4], y: f32[2,3], c: pred[]) -> f32[1,8,8,4] {
  %x = f32[1,8,8,3]{3,2,1,0} parameter(0)
  %k = f32[3,3,3,4]{3,2,1,0} parameter(1)
  %o = f32[2,3,7]{2,1,0} dot(f32[2,3]{1,0} %y, f32[7]{0} %v), lhs_batch_dims={}, rhs_batch_dims={}
  %if = f32[2,5]{1,0} conditional(pred[] %c, f32[2,3]{1,0} %y, f32[2,3]{1,0} %y), true_computation=%then, false_computation=%else
  ROOT %conv = f32[1,8,8,4]{3,2,1,0} convolution(f32[1,8,8,3]{3,2,1,0} %x, f32[3,3,3,4]{3,2,1,0} %k), window={size=3x3 pad=1_1x1_1}, dim_labels=b01f_01io->b01f
}
"""
    # The outer product contracts nothing (0); the larger branch (2*5*3);
    # 8*8*4 outputs of 3*3*3 products each.
    assert tracing.hlo_macs(hlo) == (2 * 5 * 3 + 8 * 8 * 4 * 27, False)
    with pytest.raises(ValueError, match="no ENTRY"):
        tracing.hlo_macs("HloModule m")


def test_the_docstring_examples_run():
    import doctest

    results = doctest.testmod(tracing)
    assert results.attempted and not results.failed


def test_size_report_refuses_an_unknown_size_that_is_not_a_positive_integer():
    model = keras.Sequential([keras.Input((4,)), L.Dense(2)])
    for bad in (0, 2.0, True, "6"):
        with pytest.raises(ValueError, match="unknown_size.*positive integer"):
            pruning.size_report(model, model, unknown_size=bad)
