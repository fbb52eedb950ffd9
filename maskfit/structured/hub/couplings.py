"""Couplings of keras_hub's transformer blocks: attention heads and FFN units.

keras_hub's decoder and encoder blocks (Llama, Mistral, Qwen, Gemma, the
generic `TransformerEncoder` / `TransformerDecoder` of BERT and GPT-2, ViT's
encoder) are subclassed layers whose `call` cannot be read; their couplings
are registered here per class, by the names of the sublayers they call (no
private attribute is read), and checked against the blocks' real gradients
when the graph is built (`hub_check`). What a block exposes:

- attention heads: the query, key and value kernels' (and biases') slices of
  a head, and its rows of the output projection. With grouped-query
  attention (1 < key/value heads < query heads) a unit is a key/value head
  with its whole group of query heads; with one key/value head, a unit is a
  query head (the key/value head stays).
- FFN units: a column of each input projection (gate and up in a gated FFN)
  and a row of the output projection.
- the residual stream stays: every block normalizes it as a whole.

Where a block's class derives its head size from `hidden_dim // num_heads`,
fewer heads cannot be written in its config: `shrink` then gives a Llama
block its Mistral twin (`hub_twins`), writes BERT's, GPT-2's and ViT's
blocks out as stock Keras layers (`hub_stock`), and keeps the heads of the
others (Qwen), which `explain` says. keras_hub is never imported here: classes are
matched by module and name.
"""

from typing import NamedTuple

import numpy as np

from maskfit import internals
from maskfit.kinds.attention import MultiHeadAttention
from maskfit.kinds.couplings import arguments as call_arguments
from maskfit.kinds.couplings.base import Coupling
from maskfit.kinds.couplings.calls import TensorUnits
from maskfit.kinds.couplings.lookup import add_fallback
from maskfit.kinds.couplings.parts import sublayer
from maskfit.structured.hub import check as hub_check
from maskfit.structured.hub import twins as hub_twins

__all__ = ["BlockSpec", "HubBlock", "coupling_for", "hub_class_name"]


class Attention(NamedTuple):
    """Where a block's attention weights are, by sublayer names.

    Attributes:
      path: sublayer names from the block to its attention layer.
      head_axes: `{projection name: head axis of its kernel}`; the bias's head
        axis is the kernel's minus the number of kernel axes before it that
        the bias lacks (`bias_axis`).
      bias_axis: `{projection name: head axis of its bias}`.
      query_key, kv_key: the config keys of the query and key/value head
        counts (`kv_key` None: as many as query heads).
    """

    path: tuple
    head_axes: dict
    bias_axis: dict
    query_key: str
    kv_key: object


class BlockSpec(NamedTuple):
    """One keras_hub block class's coupling: where its heads and FFN units are.

    Attributes:
      attention: an `Attention`.
      ffn_in: paths of the FFN's input projections (kernel columns = units).
      ffn_out: path of its output projection (kernel rows = units).
      ffn_key: config key of the FFN's width; `ffn_scale`: config value per
        unit (Gemma's `intermediate_dim` is twice its units).
      head_dim_key: config key of the head size, or None where the class
        derives it from `hidden_dim // num_heads` (its heads then stay).
      nested: True for a layer of several blocks (ViT's encoder): each
        sublayer that holds the attention path is a block.
    """

    attention: Attention
    ffn_in: tuple
    ffn_out: tuple
    ffn_key: str
    ffn_scale: int = 1
    head_dim_key: object = None
    nested: bool = False


_LLAMA_ATTENTION = Attention(
    ("self_attention",),
    {"query": 1, "key": 1, "value": 1, "attention_output": 0},
    {"query": 0, "key": 0, "value": 0},
    "num_query_heads",
    "num_key_value_heads",
)
_LLAMA_FFN = (
    (("feedforward_gate_dense",), ("feedforward_intermediate_dense",)),
    ("feedforward_output_dense",),
    "intermediate_dim",
)


def _mha(path):
    return Attention(
        path,
        {"query": 1, "key": 1, "value": 1, "attention_output": 0},
        {"query": 0, "key": 0, "value": 0},
        "num_heads",
        None,
    )


# Blocks that `shrink` rebuilds from stock Keras layers (`hub_stock`).
STOCK = ("TransformerEncoder", "TransformerDecoder", "ViTEncoder")

_TRANSFORMER_FFN = (
    (("feedforward_intermediate_dense",),),
    ("feedforward_output_dense",),
    "intermediate_dim",
)

SPECS = {
    "LlamaTransformerDecoder": BlockSpec(_LLAMA_ATTENTION, *_LLAMA_FFN),
    "Llama3TransformerDecoder": BlockSpec(_LLAMA_ATTENTION, *_LLAMA_FFN),
    "QwenTransformerDecoder": BlockSpec(_LLAMA_ATTENTION, *_LLAMA_FFN),
    "MistralTransformerDecoder": BlockSpec(
        _LLAMA_ATTENTION, *_LLAMA_FFN, head_dim_key="head_dim"
    ),
    "GemmaDecoderBlock": BlockSpec(
        Attention(
            ("attention",),
            {"query": 0, "key": 0, "value": 0, "attention_output": 0},
            {},
            "num_query_heads",
            "num_key_value_heads",
        ),
        (("ffw_gating",), ("ffw_gating_2",)),
        ("ffw_linear",),
        "intermediate_dim",
        ffn_scale=2,
        head_dim_key="head_dim",
    ),
    "TransformerEncoder": BlockSpec(_mha(("self_attention_layer",)), *_TRANSFORMER_FFN),
    "TransformerDecoder": BlockSpec(_mha(("self_attention",)), *_TRANSFORMER_FFN),
    "ViTEncoder": BlockSpec(
        _mha(("mha",)),
        (("mlp", "dense_1"),),
        ("mlp", "dense_2"),
        "mlp_dim",
        nested=True,
    ),
}


def hub_class_name(layer):
    """The class name of a keras_hub layer, or None for any other layer."""
    cls = type(layer)
    return cls.__name__ if cls.__module__.startswith("keras_hub.") else None


def coupling_for(layer):
    """The registered coupling of a keras_hub layer, or None."""
    name = hub_class_name(layer)
    if name == "CachedMultiHeadAttention":
        # keras.layers.MultiHeadAttention with a cache: without one (a graph
        # call), the same computation, config and weights.
        return MultiHeadAttention()
    spec = SPECS.get(name)
    return None if spec is None else HubBlock(spec)


def _weight(layer, name):
    return (
        None
        if layer is None
        else next((v for v in layer.weights if v.name == name), None)
    )


class HubBlock(Coupling):
    """A keras_hub transformer block: its heads and FFN units; the residual stays."""

    def __init__(self, spec):
        self.spec = spec

    def _blocks(self, layer):
        """`(prefix, path)` of each block: the layer itself, or its sublayers."""
        if not self.spec.nested:
            return [("", ())]
        return [
            (block.name + "/", (block.name,))
            for block in internals.sublayers(layer, recursive=False)
            if sublayer(block, self.spec.attention.path) is not None
        ]

    def couple(self, call, graph):
        layer = call.layer
        # The residual stream is the first tensor in `call`'s signature order:
        # Keras lists keyword tensors by name (a decoder called with
        # `decoder_sequence=x, decoder_padding_mask=m` lists the mask first).
        index = call_arguments.first_input(call.call)
        source = call.inputs[index]
        graph.fix(
            source.ids,
            f"the residual stream of '{layer.name}' ({type(layer).__name__}),"
            " normalized as a whole inside it",
        )
        for i, units in enumerate(call.inputs):
            if i != index:
                graph.fix(units.ids, f"read by '{layer.name}' besides its input")
        blocks = self._blocks(layer)
        if not blocks:
            return graph.refuse(
                layer,
                call.inputs,
                "has none of the blocks its coupling expects",
                call.num_outputs,
            )
        # The block is checked as the model calls it: with its other tensors
        # (an encoder sequence for cross-attention) as zeros, and without its
        # masks (an integer mask of zeros would mask every position).
        kwargs = {k: None if "mask" in k else v for k, v in call.call.kwargs.items()}
        called = (
            call_arguments.describe(call.call.args, kwargs, call.call.inputs[index]),
            call.input_shape(index),
        )
        for prefix, path in blocks:
            self._couple_block(call, graph, prefix, path, called)
        rest = TensorUnits.none(f"output of '{layer.name}' after its first")
        return [source] + [rest] * (call.num_outputs - 1)

    def _couple_block(self, call, graph, prefix, path, called):
        layer, spec = call.layer, self.spec
        attention = sublayer(layer, path + spec.attention.path)
        checked = []
        heads = self._heads(graph, layer, prefix, attention)
        if heads is not None:
            checked.append(heads)
        ffn = self._ffn(graph, layer, prefix, path)
        if ffn is not None:
            checked.append(ffn)
        described, shape = called
        hub_check.check(graph, call, checked, described=described, shape=shape)

    def _heads(self, graph, layer, prefix, attention):
        spec = self.spec.attention
        if attention is None:
            return None
        projections = {name: sublayer(attention, (name,)) for name in spec.head_axes}
        if any(p is None for p in projections.values()):
            return None
        num_query = projections["query"].weights[0].shape[spec.head_axes["query"]]
        num_kv = projections["key"].weights[0].shape[spec.head_axes["key"]]
        if num_kv == num_query or num_kv == 1:
            size, query_ids = num_query, np.arange(num_query)
            kv_ids = np.arange(num_kv) if num_kv == num_query else None
        elif num_query % num_kv == 0:
            size = num_kv
            query_ids = np.repeat(np.arange(num_kv), num_query // num_kv)
            kv_ids = np.arange(num_kv)
        else:
            return None
        space = graph.new_space(layer, prefix + "heads", size, kind="heads")
        ids = {
            "query": query_ids,
            "key": kv_ids,
            "value": kv_ids,
            "attention_output": query_ids,
        }
        sliced = []
        for name, dense in projections.items():
            if ids[name] is None:
                continue
            node_ids = space.first + ids[name]
            kernel = _weight(dense, "kernel")
            graph.slice(layer, kernel, spec.head_axes[name], node_ids)
            closes = name == "attention_output"
            sliced.append((kernel, spec.head_axes[name], node_ids, closes))
            bias = _weight(dense, "bias")
            if bias is not None and name in spec.bias_axis:
                graph.slice(layer, bias, spec.bias_axis[name], node_ids, scored=False)
                sliced.append((bias, spec.bias_axis[name], node_ids, False))
        graph.note(
            layer, prefix + "kv", (space.first + kv_ids) if kv_ids is not None else None
        )
        graph.note(layer, prefix + "query", space.first + query_ids)
        problem = self.heads_problem(layer)
        if problem:
            graph.fix(space.ids, problem)
        return space, sliced

    def heads_problem(self, layer):
        """Why `layer`'s heads cannot go (a clause), or None."""
        if self.spec.head_dim_key is not None:
            return None
        name = type(layer).__name__
        derives = (
            f"{name} derives its head size from hidden_dim // num_heads, so a block"
            " with fewer heads cannot be rebuilt with the same head size"
        )
        if name in STOCK:
            return None
        if name not in hub_twins.TWINS:
            return derives
        problem = hub_twins.twin_problem(layer)
        if problem:
            return f"{derives}, and its twin class cannot stand in: {problem}"
        return None

    def _ffn(self, graph, layer, prefix, path):
        spec = self.spec
        inputs = [sublayer(layer, path + p) for p in spec.ffn_in]
        output = sublayer(layer, path + spec.ffn_out)
        if output is None or any(d is None for d in inputs):
            return None
        kernel = _weight(output, "kernel")
        space = graph.new_space(layer, prefix + "units", kernel.shape[0])
        sliced = [(kernel, 0, space.ids, True)]
        graph.slice(layer, kernel, 0, space.ids)
        for dense in inputs:
            own = _weight(dense, "kernel")
            graph.slice(layer, own, -1, space.ids)
            sliced.append((own, len(own.shape) - 1, space.ids, False))
            bias = _weight(dense, "bias")
            if bias is not None:
                graph.slice(layer, bias, 0, space.ids, scored=False)
                sliced.append((bias, 0, space.ids, False))
        return space, sliced

    def counts(self, layer, shrunk):
        """`{config key: value}` of `layer`'s kept heads and FFN units, per block."""
        found = []
        spec = self.spec
        for prefix, _ in self._blocks(layer):
            config = {}
            if shrunk.graph.own_space(layer, prefix + "units") is not None:
                config[spec.ffn_key] = (
                    shrunk.count(layer, prefix + "units") * spec.ffn_scale
                )
            query = shrunk.note(layer, prefix + "query")
            if query is not None:
                config[spec.attention.query_key] = int(np.sum(shrunk.kept(query)))
                kv = shrunk.note(layer, prefix + "kv")
                if kv is not None and spec.attention.kv_key:
                    config[spec.attention.kv_key] = int(np.sum(shrunk.kept(kv)))
            found.append(config)
        return found

    def shrink_config(self, layer, config, shrunk):
        counts = self.counts(layer, shrunk)
        if any(c != counts[0] for c in counts[1:]):
            raise ValueError(
                f"shrink: layer '{layer.name}' ({type(layer).__name__}) holds"
                f" {len(counts)} blocks with one config, which would keep"
                f" {counts}. Prune them uniformly (global_pruning=False)."
            )
        config.update(counts[0])
        if self.spec.head_dim_key is not None:
            config[self.spec.head_dim_key] = head_size(layer, self.spec)
        return config

    def rebuild(self, layer, config, shrunk):
        """The smaller block: its class or its twin; None for stock layers.

        Args:
          config: the block's config (`hub_shrink.config_of`).

        Returns:
          The new block, or None where it must be written out as stock Keras
          layers (a block of `STOCK` with fewer heads): `shrinking` then makes
          a `hub_stock.StockBlock`.
        """
        name = type(layer).__name__
        counts = self.counts(layer, shrunk)
        key = self.spec.attention.query_key
        same_heads = all(c.get(key) == getattr(layer, key, None) for c in counts)
        same = all(c == counts[0] for c in counts[1:])
        if same and (same_heads or self.spec.head_dim_key is not None):
            return type(layer).from_config(self.shrink_config(layer, config, shrunk))
        if same and name in hub_twins.TWINS:
            config = self.shrink_config(layer, config, shrunk)
            return hub_twins.twin_class(name).from_config(
                hub_twins.twin_config(name, config, head_size(layer, self.spec))
            )
        if name in STOCK:
            return None  # `shrinking` writes it out as stock layers (`hub_stock`)
        return type(layer).from_config(self.shrink_config(layer, config, shrunk))


def head_size(layer, spec):
    """The head size of `layer`'s attention (its query kernel's last axis)."""
    _, path = HubBlock(spec)._blocks(layer)[0]
    attention = sublayer(layer, path + spec.attention.path)
    return int(sublayer(attention, ("query",)).weights[0].shape[-1])


# `couplings.coupling_of` asks this module about layers it has no record for.
add_fallback(coupling_for)
