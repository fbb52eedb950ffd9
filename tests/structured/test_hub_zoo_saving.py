"""The zoo's shrunk keras_hub backbones load with Keras and keras_hub alone.

Every backbone of `tests/structured/test_hub_zoo.py` that `select_units(model,
0.5)` and `shrink` make smaller is saved to a `.keras` file; one fresh Python
process that imports only keras, keras_hub and NumPy (maskfit is not importable
there: its path is taken off `sys.path` and the import is refused) loads each
file with `safe_mode=True` and gives the same outputs as the shrunk model;
those a keras_hub bug stops saving or loading are `KERAS_HUB_BUGS`.
"""

import json
import os
import subprocess
import sys
import textwrap
import zipfile

import numpy as np
import pytest

import maskfit.pruning as pruning
from tests.helpers import hub_cases, hub_zoo
from tests.structured import test_hub_zoo

keras_hub = pytest.importorskip("keras_hub", reason="needs the hub extra")

pytestmark = test_hub_zoo.pytestmark

# Shrunk backbones a fresh process cannot load because of keras_hub itself
# (keras-hub 0.32), with what the error says: the shrunk ViT is a functional
# model of keras_hub's layers, and `ViTPatchingAndEmbedding.get_config()` writes
# `num_patches` and `num_positions`, which its `__init__` refuses
# (`test_vit_patching_config_does_not_round_trip` below is the reproduction;
# the `ViTBackbone` itself loads: its own config rebuilds the layer).
# The shrunk RWKV7 is a functional model of `RWKV7_Block`s; loading builds
# each from its saved `build_config`, whose shape JSON gives back as a list,
# and `RWKV7ChannelMix.build` takes a list for a list of shapes and reads the
# first (None) as the shape (`test_rwkv7_block_does_not_build_from_a_saved_shape`;
# the `RWKV7Backbone` itself loads: its constructor calls the blocks).
# The shrunk DeiT cannot even be saved: `DeiTEncoder.get_config()` reads
# `self.key_dim`, which its `__init__` never sets
# (`test_deit_encoder_config_cannot_be_written`; the `DeiTBackbone` as keras_hub
# builds it cannot be saved either).
# The shrunk GPT-NeoX and Qwen3 are functional models of their keras_hub
# blocks, whose configs do not round trip: `GPTNeoXDecoder.get_config()`
# writes `decoder_sequence_shape`, which its `__init__` refuses;
# `Qwen3TransformerDecoder.get_config()` leaves out `head_dim`, which its
# `__init__` requires (`test_decoder_configs_do_not_round_trip`). The shrunk
# DeBERTa v3 holds keras_hub's `RelativeEmbedding`, whose layer norm is built in
# `call`, not `build`, so loading finds weights for an unbuilt layer
# (`test_relative_embedding_does_not_load`).
KERAS_HUB_BUGS = {
    "ViTBackbone": "Unrecognized keyword arguments passed to ViTPatchingAndEmbedding",
    "RWKV7Backbone": "'NoneType' object is not subscriptable",
    "DeiTBackbone": "'DeiTEncoder' object has no attribute 'key_dim'",
    "GPTNeoXBackbone": "Unrecognized keyword arguments passed to GPTNeoXDecoder",
    "Qwen3Backbone": "missing 1 required positional argument: 'head_dim'",
    "DebertaV3Backbone": "Layer 'rel_embeddings_layer_norm' was never built",
}

# Loads the files named in argv[1]'s index with keras and keras_hub only and
# writes each model's flattened outputs beside its file.
_LOADER = textwrap.dedent(
    """
    import importlib.abc, json, os, sys

    class NoMaskfit(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path, target=None):
            if name == "maskfit" or name.startswith("maskfit."):
                raise ImportError("maskfit must not be imported here: " + name)

    sys.meta_path.insert(0, NoMaskfit())
    import keras, keras_hub, numpy as np

    folder = sys.argv[1]
    errors = {}
    for name in json.load(open(os.path.join(folder, "index.json"))):
        try:
            model = keras.saving.load_model(
                os.path.join(folder, name + ".keras"), safe_mode=True
            )
        except Exception as error:
            errors[name] = f"{type(error).__name__}: {error}"
            continue
        inputs = dict(np.load(os.path.join(folder, name + ".in.npz")))
        if list(inputs) == ["x"]:
            inputs = inputs["x"]
        flat = [
            np.asarray(keras.ops.convert_to_numpy(y), np.float64).reshape(-1)
            for y in keras.tree.flatten(model(inputs))
        ]
        np.save(os.path.join(folder, name + ".out.npy"), np.concatenate(flat))
    json.dump(errors, open(os.path.join(folder, "errors.json"), "w"))
    print("maskfit imported:", any(m.split(".")[0] == "maskfit" for m in sys.modules))
    """
)


def test_shrunk_backbones_load_with_keras_and_keras_hub_alone(tmp_path):
    names = [n for n in hub_zoo.available() if n in test_hub_zoo.SHRUNK]
    assert len(names) == len(test_hub_zoo.SHRUNK)
    expected, unsaved = {}, {}
    for name in names:
        model, inputs = hub_zoo.build(name)
        small = pruning.shrink(model, pruning.select_units(model, 0.5))
        assert small.count_params() < model.count_params(), name
        path = tmp_path / f"{name}.keras"
        try:
            small.save(path)
        except AttributeError as error:
            unsaved[name] = str(error)
            continue
        with zipfile.ZipFile(path) as archive:  # nothing in the file names maskfit
            assert "maskfit" not in archive.read("config.json").decode().lower()
        arrays = inputs if isinstance(inputs, dict) else {"x": inputs}
        np.savez(tmp_path / f"{name}.in.npz", **arrays)
        expected[name] = hub_cases.outputs(small, inputs)
    (tmp_path / "index.json").write_text(
        json.dumps([n for n in names if n not in unsaved])
    )
    env = {**os.environ, "PYTHONPATH": "", "TF_CPP_MIN_LOG_LEVEL": "2"}
    done = subprocess.run(
        [sys.executable, "-c", _LOADER, str(tmp_path)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "maskfit imported: False" in done.stdout
    errors = {**json.loads((tmp_path / "errors.json").read_text()), **unsaved}
    assert sorted(errors) == sorted(KERAS_HUB_BUGS), errors
    for name, words in KERAS_HUB_BUGS.items():
        assert words in errors[name], errors[name]
    for name in names:
        if name in errors:
            continue
        loaded = np.load(tmp_path / f"{name}.out.npy")
        hub_cases.assert_close(loaded, expected[name])


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
