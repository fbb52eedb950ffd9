"""`size_report` on keras_hub models: parameters as `count_params()`, MACs traced.

Parameters count tied embeddings once. The MACs of keras_hub's blocks and of
the reversible embedding called as the output projection are traced
(`maskfit.structured.tracing`) and checked against the count written out
from each config: projections, attention's scores and values per head, the
FFN with its gate, the LM head.
"""

import pytest

import maskfit.pruning as pruning

keras_hub = pytest.importorskip("keras_hub", reason="needs the hub extra")

pytestmark = pytest.mark.backends("tensorflow", "jax")

LENGTH = 6  # the sequence length the MACs are counted at


def _llama_macs(
    layers, hidden, query_heads, kv_heads, head_dim, ffn, vocabulary, tokens=LENGTH
):
    """A Llama causal LM's MACs per sequence of `tokens` tokens, from its config."""
    block = (
        tokens * hidden * query_heads * head_dim  # query projection
        + 2 * tokens * hidden * kv_heads * head_dim  # key and value projections
        + query_heads * tokens * tokens * head_dim  # scores, per query head
        + query_heads * tokens * tokens * head_dim  # values weighted, per head
        + tokens * query_heads * head_dim * hidden  # output projection
        + 3 * tokens * hidden * ffn  # gate, up and down projections
    )
    return layers * block + tokens * hidden * vocabulary  # the tied LM head


def test_a_causal_lm_counts_its_tied_embedding_once_and_every_product():
    config = dict(vocabulary_size=64, num_layers=2, hidden_dim=16)
    config |= dict(num_query_heads=4, num_key_value_heads=2, intermediate_dim=32)
    backbone = keras_hub.models.LlamaBackbone(**config)
    model = keras_hub.models.LlamaCausalLM(backbone=backbone, preprocessor=None)
    small = pruning.shrink(model, pruning.select_units(model, 0.5), uniform=True)
    report = pruning.size_report(model, small, unknown_size=LENGTH)
    # The token embedding is called twice (embedding, then reversed as the
    # output projection): its 64 x 16 entries count once.
    assert report.params_before == model.count_params() == 6736
    assert report.params_after == small.count_params()
    assert report.params_after < report.params_before
    assert report.macs_before == _llama_macs(2, 16, 4, 2, 4, 32, 64) == 36096
    # Half the heads (one key/value group of two) and half the FFN units.
    assert report.macs_after == _llama_macs(2, 16, 2, 1, 4, 16, 64)
    rows = {r.name: r for r in report.rows}
    assert rows["token_embedding"].macs_before == LENGTH * 16 * 64
    assert rows["token_embedding"].params_before == 0  # counted in the backbone
    assert rows["llama_backbone/token_embedding"].macs_before == 0  # a lookup
    assert report.notes == ()
    # At one token (the default), attention's scores and values are 1 x 1.
    one = pruning.size_report(model, small)
    assert one.macs_before == _llama_macs(2, 16, 4, 2, 4, 32, 64, tokens=1) == 5696


def test_bert_counts_its_encoder_blocks_and_pooler():
    layers, hidden, heads, ffn = 2, 16, 2, 32
    model = keras_hub.models.BertBackbone(
        vocabulary_size=50,
        num_layers=layers,
        num_heads=heads,
        hidden_dim=hidden,
        intermediate_dim=ffn,
        max_sequence_length=16,
    )
    report = pruning.size_report(model, model, unknown_size=LENGTH)
    assert report.params_before == model.count_params()
    tokens, head_dim = LENGTH, hidden // heads
    block = (
        3 * tokens * hidden * hidden  # query, key, value
        + 2 * heads * tokens * tokens * head_dim  # scores and values, per head
        + tokens * hidden * hidden  # output projection
        + 2 * tokens * hidden * ffn  # FFN in and out
    )
    pooler = hidden * hidden  # a Dense on the first token
    assert report.macs_before == layers * block + pooler == 27136


def test_unknown_size_must_be_a_positive_integer():
    backbone = keras_hub.models.LlamaBackbone(
        vocabulary_size=8,
        num_layers=1,
        num_query_heads=2,
        num_key_value_heads=1,
        hidden_dim=4,
        intermediate_dim=4,
    )
    for bad in (0, 2.0, True, "6"):
        with pytest.raises(ValueError, match="unknown_size.*positive integer"):
            pruning.size_report(backbone, backbone, unknown_size=bad)
