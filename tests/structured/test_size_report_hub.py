"""`size_report` on keras_hub models: parameters as `count_params()`, MACs traced.

Parameters count tied embeddings once. The MACs of keras_hub's blocks and of
the reversible embedding called as the output projection are traced
(`maskfit.structured.tracing`) and checked against the count written out
from each config: projections, attention's scores and values per head, the
FFN with its gate, the LM head.
"""

import inspect

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


def _rebuilds_heads():
    """Whether this keras_hub's Mistral block takes `head_dim` (0.32 and later)."""
    decoder = keras_hub.src.models.mistral.mistral_transformer_decoder
    init = decoder.MistralTransformerDecoder.__init__
    return "head_dim" in inspect.signature(init).parameters


def test_a_causal_lm_counts_its_tied_embedding_once_and_every_product():
    config = dict(vocabulary_size=64, num_layers=2, hidden_dim=16)
    config |= dict(num_query_heads=4, num_key_value_heads=2, intermediate_dim=32)
    backbone = keras_hub.models.LlamaBackbone(**config)
    model = keras_hub.models.LlamaCausalLM(backbone=backbone, preprocessor=None)
    selection = pruning.select_units(model, 0.5)
    small = pruning.shrink(model, selection)
    report = pruning.size_report(model, small, unknown_size=LENGTH)
    # The token embedding is called twice (embedding, then reversed as the
    # output projection): its 64 x 16 entries count once.
    assert report.params_before == model.count_params() == 6736
    assert report.params_after == small.count_params()
    assert report.params_after < report.params_before
    assert report.macs_before == _llama_macs(2, 16, 4, 2, 4, 32, 64) == 36096
    # Half the heads (one key/value group of two) and half the FFN units. A
    # keras_hub before 0.32 cannot rebuild a Llama block with fewer heads at the
    # same head size (`explain` says so): there only the FFN units go.
    groups = 1 if selection.removed()["transformer_layer_0"].get("heads") else 2
    if _rebuilds_heads():
        assert groups == 1
    assert report.macs_after == _llama_macs(2, 16, 2 * groups, groups, 4, 16, 64)
    rows = {r.name: r for r in report.rows}
    assert rows["token_embedding"].macs_before == LENGTH * 16 * 64
    assert rows["token_embedding"].params_before == 0  # counted in the backbone
    assert rows["llama_backbone/token_embedding"].macs_before == 0  # a lookup
    assert report.notes == ()
    # At one token (the default), attention's scores and values are 1 x 1.
    one = pruning.size_report(model, small)
    assert one.macs_before == _llama_macs(2, 16, 4, 2, 4, 32, 64, tokens=1) == 5696


def _bert_macs(layers, hidden, heads, head_dim, ffn, tokens=LENGTH):
    """A BERT backbone's MACs per sequence of `tokens` tokens, from its config."""
    block = (
        3 * tokens * hidden * heads * head_dim  # query, key, value
        + 2 * heads * tokens * tokens * head_dim  # scores and values, per head
        + tokens * heads * head_dim * hidden  # output projection
        + 2 * tokens * hidden * ffn  # FFN in and out
    )
    return layers * block + hidden * hidden  # the pooler: a Dense on one token


def _bert():
    return keras_hub.models.BertBackbone(
        vocabulary_size=50,
        num_layers=2,
        num_heads=2,
        hidden_dim=16,
        intermediate_dim=32,
        max_sequence_length=16,
    )


def test_bert_counts_its_encoder_blocks_and_pooler():
    model = _bert()
    report = pruning.size_report(model, model, unknown_size=LENGTH)
    assert report.params_before == model.count_params()
    assert report.macs_before == _bert_macs(2, 16, 2, 8, 32) == 27136
    assert report.notes == ()


@pytest.mark.backends("tensorflow")  # the count is the one above; JAX's select is slow
def test_bert_shrunk_into_stock_layers_counts_them_as_its_blocks():
    model = _bert()
    small = pruning.shrink(model, pruning.select_units(model, 0.5))
    report = pruning.size_report(model, small, unknown_size=LENGTH)
    # One head of two and half the FFN, the blocks written out as stock
    # layers (a MultiHeadAttention whose mask comes after its value): their
    # sizes are the blocks'.
    assert report.params_after == small.count_params()
    assert report.macs_after == _bert_macs(2, 16, 1, 8, 16) == 13696
    assert [r.name for r in report.rows][4:6] == [
        "transformer_layer_0",
        "transformer_layer_1",
    ]
