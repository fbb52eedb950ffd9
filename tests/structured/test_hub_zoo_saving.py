"""keras_hub bugs that stop some of the zoo's shrunk backbones saving or loading.

`test_hub_zoo.py` saves every shrunk backbone and loads it with keras and
keras_hub alone; those that fail there (`test_hub_zoo.KERAS_HUB_BUGS`) fail
because of keras_hub itself, reproduced here, small, without maskfit.
"""

import pytest

from tests.structured import test_hub_zoo

keras_hub = pytest.importorskip("keras_hub", reason="needs the hub extra")

pytestmark = test_hub_zoo.pytestmark


def test_vit_patching_config_does_not_round_trip():
    from keras_hub.src.models.vit.vit_layers import ViTPatchingAndEmbedding

    layer = ViTPatchingAndEmbedding(
        image_size=(16, 16), patch_size=(8, 8), hidden_dim=16, num_channels=3
    )
    with pytest.raises(TypeError, match="num_patches"):
        ViTPatchingAndEmbedding.from_config(layer.get_config())


def test_rwkv7_block_does_not_build_from_a_saved_shape():
    from keras_hub.src.models.rwkv7.rwkv7_layer import RWKV7_Block

    sizes = (16, 8, 32, 16, 16, 16, 16)  # hidden, head, FFN and LoRA sizes
    RWKV7_Block(*sizes).build((None, None, 16))  # a tuple, as a call gives
    # The same shape as a .keras file's JSON build_config gives it back.
    with pytest.raises(TypeError, match="'NoneType' object is not subscriptable"):
        RWKV7_Block(*sizes).build([None, None, 16])


def test_deit_encoder_config_cannot_be_written():
    from keras_hub.src.models.deit.deit_layers import DeiTEncoder

    encoder = DeiTEncoder(num_layers=1, num_heads=2, hidden_dim=16, intermediate_dim=32)
    with pytest.raises(AttributeError, match="no attribute 'key_dim'"):
        encoder.get_config()


@pytest.mark.parametrize(
    "module, name, kwargs, words",
    [
        (
            "gpt_neo_x.gpt_neo_x_decoder",
            "GPTNeoXDecoder",
            dict(intermediate_dim=32, num_heads=2),
            "decoder_sequence_shape",
        ),
        (
            "qwen3.qwen3_decoder",
            "Qwen3TransformerDecoder",
            dict(
                intermediate_dim=32,
                num_query_heads=2,
                num_key_value_heads=1,
                head_dim=8,
            ),
            "head_dim",
        ),
    ],
)
def test_decoder_configs_do_not_round_trip(module, name, kwargs, words):
    import importlib

    cls = getattr(importlib.import_module(f"keras_hub.src.models.{module}"), name)
    layer = cls(**kwargs)
    layer.build((None, 4, 16))
    with pytest.raises(TypeError, match=words):
        cls.from_config(layer.get_config())


def test_relative_embedding_does_not_load(tmp_path):
    import keras
    from keras_hub.src.models.deberta_v3.relative_embedding import RelativeEmbedding

    inputs = keras.Input((4, 16))
    model = keras.Model(inputs, RelativeEmbedding(16, 4)(inputs))
    model.save(tmp_path / "model.keras")
    with pytest.raises(ValueError, match="'rel_embeddings_layer_norm' was never built"):
        keras.saving.load_model(tmp_path / "model.keras")
