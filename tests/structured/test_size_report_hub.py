"""`size_report` counts parameters as `count_params()` does, tied embeddings once."""

import pytest

import maskfit.pruning as pruning

keras_hub = pytest.importorskip("keras_hub", reason="needs the hub extra")

pytestmark = pytest.mark.backends("tensorflow", "jax")


def test_a_causal_lm_with_a_tied_embedding_counts_it_once():
    backbone = keras_hub.models.LlamaBackbone(
        vocabulary_size=64,
        num_layers=2,
        num_query_heads=4,
        num_key_value_heads=2,
        hidden_dim=16,
        intermediate_dim=32,
    )
    model = keras_hub.models.LlamaCausalLM(backbone=backbone, preprocessor=None)
    small = pruning.shrink(model, pruning.select_units(model, 0.5))
    report = pruning.size_report(model, small)
    # The token embedding is called twice (embedding, then reversed as the
    # output projection): its 64 x 16 entries count once.
    assert report.params_before == model.count_params() == 6736
    assert report.params_after == small.count_params()
    assert report.params_after < report.params_before
