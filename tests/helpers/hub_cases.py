"""Tiny keras_hub backbones for the structured-pruning tests, and what they share.

Presets cannot be downloaded here: each backbone is built from constructor
arguments, small enough to prune, fit and shrink in seconds.
"""

import os
import subprocess
import sys
import textwrap

import keras
import numpy as np

SEQUENCE = 6


def _tokens(vocabulary, rng, **extra):
    padding = np.ones((2, SEQUENCE), "int32")
    padding[1, 4:] = 0
    found = {
        "token_ids": rng.integers(0, vocabulary, (2, SEQUENCE)).astype("int32"),
        "padding_mask": padding,
    }
    found.update(extra)
    return found


# The tiny configurations, by name: the keras_hub class and its constructor
# arguments. Tests that need another size pass changes to `backbone`.
_DECODER = dict(
    vocabulary_size=50,
    num_layers=2,
    num_query_heads=4,
    num_key_value_heads=2,
    hidden_dim=16,
    intermediate_dim=32,
)
_ENCODER = dict(
    vocabulary_size=50,
    num_layers=2,
    num_heads=4,
    hidden_dim=16,
    intermediate_dim=64,
    max_sequence_length=SEQUENCE,
)
CONFIGS = {
    "llama": ("LlamaBackbone", _DECODER),
    "llama3": ("Llama3Backbone", _DECODER),
    "mistral": ("MistralBackbone", _DECODER),
    "qwen": ("QwenBackbone", _DECODER),
    "gemma": (
        "GemmaBackbone",
        {**_DECODER, "num_key_value_heads": 1, "intermediate_dim": 64, "head_dim": 4},
    ),
    "bert": ("BertBackbone", _ENCODER),
    "gpt2": ("GPT2Backbone", _ENCODER),
    "opt": ("OPTBackbone", _ENCODER),
    "vit": (
        "ViTBackbone",
        dict(image_shape=(8, 8, 3), patch_size=4, num_layers=2, num_heads=4)
        | dict(hidden_dim=16, mlp_dim=64),
    ),
    "resnet": (
        "ResNetBackbone",
        dict(input_conv_filters=[64], input_conv_kernel_sizes=[3])
        | dict(stackwise_num_filters=[64, 32], stackwise_num_blocks=[1, 1])
        | dict(stackwise_num_strides=[1, 2], block_type="basic_block")
        | dict(image_shape=(16, 16, 3)),
    ),
}


def backbone(name, cls=None, **changes):
    """The tiny keras_hub backbone `name` (its class, or `cls`), with `changes`."""
    import keras_hub

    default, config = CONFIGS[name]
    return getattr(keras_hub.models, cls or default)(**{**config, **changes})


def build(name):
    """`(backbone, inputs)` of the tiny backbone `name`."""
    rng = np.random.default_rng(0)
    keras.utils.set_random_seed(0)
    model = backbone(name)
    if name == "vit":
        return model, rng.normal(size=(2, 8, 8, 3)).astype("float32")
    if name == "resnet":
        return model, rng.normal(size=(2, 16, 16, 3)).astype("float32")
    if name == "bert":
        return model, _tokens(50, rng, segment_ids=np.zeros((2, SEQUENCE), "int32"))
    return model, _tokens(50, rng)


def outputs(model, inputs):
    """The model's outputs as one flat float64 array."""
    return np.concatenate(
        [
            np.asarray(keras.ops.convert_to_numpy(y), np.float64).reshape(-1)
            for y in keras.tree.flatten(model(inputs))
        ]
    )


def masked_outputs(selection, inputs):
    """The selection's model's outputs with the removed entries set to 0 (put back)."""
    graph = selection.graph
    saved = []
    for entry in graph.sliced_variables():
        variable = entry.variable
        value = np.asarray(keras.ops.convert_to_numpy(variable))
        saved.append((variable, value))
        keep = np.ones(value.shape, bool)
        for axis, ids in entry.axes.items():
            shape = [1] * value.ndim
            shape[axis] = -1
            keep &= graph.kept_positions(ids, selection.kept).reshape(shape)
        variable.assign(np.where(keep, value, 0).astype(value.dtype))
    try:
        return outputs(graph.model, inputs)
    finally:
        for variable, value in saved:
            variable.assign(value)


def assert_close(actual, expected):
    """Equal up to rtol 1e-5 of the output's scale."""
    scale = max(float(np.max(np.abs(expected))), 1e-12)
    np.testing.assert_allclose(actual, expected, rtol=0, atol=1e-5 * scale)


def block_params(model):
    """Parameters outside embeddings and the final normalization."""
    total = 0
    for layer in model.layers:
        kind = type(layer).__name__
        if "Embedding" in kind or not layer.weights:
            continue
        total += sum(int(np.prod(w.shape)) for w in layer.weights)
    return total


def loads_without_maskfit(path, inputs_path, expected_path):
    """Loads a saved model in a fresh process that cannot import maskfit."""
    script = textwrap.dedent(
        f"""
        import importlib.abc, sys

        class NoMaskfit(importlib.abc.MetaPathFinder):
            # CI installs maskfit into the venv, so hiding the checkout is not
            # enough: any import of maskfit from here on fails.
            def find_spec(self, name, path=None, target=None):
                if name == "maskfit" or name.startswith("maskfit."):
                    raise ImportError("maskfit is blocked in this process")

        sys.meta_path.insert(0, NoMaskfit())
        import numpy as np, keras, keras_hub
        model = keras.saving.load_model({str(path)!r})
        inputs = dict(np.load({str(inputs_path)!r}))
        if list(inputs) == ["images"]:
            inputs = inputs["images"]
        got = np.concatenate([np.asarray(y, np.float64).reshape(-1)
                              for y in keras.tree.flatten(model(inputs))])
        expected = np.load({str(expected_path)!r})
        scale = max(float(np.max(np.abs(expected))), 1e-12)
        assert np.max(np.abs(got - expected)) <= 1e-5 * scale, "outputs differ"
        assert not any(m.split(".")[0] == "maskfit" for m in sys.modules)
        print(type(model).__name__)
        """
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run(
        [sys.executable, "-c", script],
        cwd="/",
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.strip().splitlines()[-1]


def save_inputs(inputs, path):
    if isinstance(inputs, dict):
        np.savez(path, **inputs)
    else:
        np.savez(path, images=inputs)


__all__ = [
    "assert_close",
    "block_params",
    "build",
    "loads_without_maskfit",
    "masked_outputs",
    "outputs",
    "save_inputs",
]
