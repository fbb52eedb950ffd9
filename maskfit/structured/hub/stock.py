"""keras_hub blocks rebuilt from stock Keras layers, where their class cannot shrink.

keras_hub's `TransformerEncoder` (BERT), `TransformerDecoder` (GPT-2) and
`ViTEncoder` derive their head size from `hidden_dim // num_heads`: a block
with fewer heads of the same size cannot be written in their configs. Their
computation is stock Keras layers in a fixed order (layer norms, a
`MultiHeadAttention`, dropouts, residual adds, two `Dense`), so `shrink`
writes each such block out as those layers in the functional model, each
named `<block>_<sublayer>`, with `num_heads` and the FFN's `units` kept. The
model saves and loads with Keras alone. A `StockBlock` is called where the
block was called, with the block's arguments.
"""

import inspect

import keras

from maskfit.kinds.couplings.parts import sublayer
from maskfit.structured.hub import couplings as couplings_hub

__all__ = ["BUILDERS", "StockBlock"]


class StockBlock:
    """Stands in for a keras_hub block in `shrink`'s functional model.

    Args:
      layer: the block of the pruned model.
      shrunk: `shrink`'s record of what stays (`count`, `kept`).
      coupling: the block's `HubBlock` coupling.

    Attributes:
      pairs: `(old sublayer, new stock layer)`, for the weights to be cut.
    """

    def __init__(self, layer, shrunk, coupling):
        self.layer, self.shrunk, self.coupling = layer, shrunk, coupling
        self.pairs = []
        self._made = {}

    def new(self, path, **changes):
        """The stock layer standing for the sublayer at `path` (made once)."""
        old = sublayer(self.layer, path)
        key = tuple(path)
        if key not in self._made:
            config = old.get_config()
            config.update(changes)
            config["name"] = f"{self.layer.name}_{'_'.join(path)}"
            cls = type(old)
            if not cls.__module__.startswith("keras."):
                cls = keras.layers.MultiHeadAttention  # keras_hub's cached one
                config = {
                    k: v
                    for k, v in config.items()
                    if k in inspect.signature(cls.__init__).parameters
                    or k in ("name", "trainable", "dtype")
                }
            new = cls.from_config(config)
            self._made[key] = new
            self.pairs.append((old, new))
        return self._made[key]

    def heads(self, prefix):
        return self.shrunk.count(self.layer, prefix + "heads")

    def units(self, prefix):
        return self.shrunk.count(self.layer, prefix + "units")

    def __call__(self, *args, **kwargs):
        bound = inspect.signature(self.layer.call).bind(*args, **kwargs)
        return BUILDERS[type(self.layer).__name__](self, dict(bound.arguments))


def _add(block, name, a, b):
    key = ("add", name)
    if key not in block._made:
        block._made[key] = keras.layers.Add(name=f"{block.layer.name}_{name}")
    return block._made[key]([a, b])


def _padding(block, mask):
    """`(batch, 1, length)` from a `(batch, length)` padding mask, as keras_hub merges it."""
    if mask is None:
        return None
    key = ("mask",)
    if key not in block._made:
        block._made[key] = keras.layers.Reshape(
            (1, -1), name=f"{block.layer.name}_attention_mask"
        )
    return block._made[key](mask)


def _transformer(block, arguments, sequence, mask, causal, cross=False):
    layer = block.layer
    first = layer.normalize_first
    attention_name = couplings_hub.SPECS[type(layer).__name__].attention.path[0]
    x = arguments[sequence]
    attention_mask = _padding(block, arguments.get(mask))
    residual = x
    norm = block.new(("self_attention_layer_norm",))
    if first:
        x = norm(x)
    attention = block.new((attention_name,), num_heads=block.heads(""))
    extra = {"use_causal_mask": True} if causal else {}
    x = attention(x, x, attention_mask=attention_mask, **extra)
    x = block.new(("self_attention_dropout",))(x)
    x = _add(block, "attention_add", x, residual)
    if not first:
        x = norm(x)
    if cross:
        x = _cross_attention(block, arguments, x)
    residual = x
    norm = block.new(("feedforward_layer_norm",))
    if first:
        x = norm(x)
    x = block.new(("feedforward_intermediate_dense",), units=block.units(""))(x)
    x = block.new(("feedforward_output_dense",))(x)
    x = block.new(("feedforward_dropout",))(x)
    x = _add(block, "feedforward_add", x, residual)
    if not first:
        x = norm(x)
    return x


def _encoder(block, arguments):
    return _transformer(block, arguments, "inputs", "padding_mask", causal=False)


def _cross_attention(block, arguments, x):
    """keras_hub's cross-attention step: its heads all stay (the coupling prunes
    the self-attention's), so its layers are copied whole."""
    if arguments.get("encoder_attention_mask") is not None:
        raise ValueError(
            f"shrink: '{block.layer.name}' (TransformerDecoder) is called with an"
            " encoder_attention_mask, which maskfit's rebuild of its"
            " cross-attention does not merge. Keep its heads (ignored_layers)."
        )
    first = block.layer.normalize_first
    residual = x
    norm = block.new(("cross_attention_layer_norm",))
    if first:
        x = norm(x)
    mask = _padding(block, arguments.get("encoder_padding_mask"))
    x = block.new(("cross_attention",))(
        x, arguments["encoder_sequence"], attention_mask=mask
    )
    x = block.new(("cross_attention_dropout",))(x)
    x = _add(block, "cross_attention_add", x, residual)
    return x if first else norm(x)


def _decoder(block, arguments):
    causal = arguments.get("use_causal_mask", True)
    cross = arguments.get("encoder_sequence") is not None
    return _transformer(
        block, arguments, "decoder_sequence", "decoder_padding_mask", causal, cross
    )


def _vit(block, arguments):
    x = block.new(("dropout",))(arguments["inputs"])
    names = [prefix for prefix, _ in block.coupling._blocks(block.layer)]
    for prefix in names:
        name = prefix[:-1]
        inputs = x
        x = block.new((name, "ln_1"))(x)
        x = block.new((name, "mha"), num_heads=block.heads(prefix))(x, x)
        x = block.new((name, "dropout"))(x)
        x = _add(block, f"{name}_attention_add", x, inputs)
        y = block.new((name, "ln_2"))(x)
        y = block.new((name, "mlp", "dense_1"), units=block.units(prefix))(y)
        y = block.new((name, "mlp", "dropout"))(y)
        y = block.new((name, "mlp", "dense_2"))(y)
        y = block.new((name, "mlp", "dropout"))(y)
        x = _add(block, f"{name}_mlp_add", x, y)
    return block.new(("ln",))(x)


BUILDERS = {
    "TransformerEncoder": _encoder,
    "TransformerDecoder": _decoder,
    "ViTEncoder": _vit,
}
