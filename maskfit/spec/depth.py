"""The blocks of a model, input side first: what `layerwise_decay` counts depth over.

A functional graph is cut where every path from an input to the outputs
passes through one call (`maskfit.spec.stacks`: a chain's every layer, a
residual block's `Add`, a transformer layer; in an encoder-decoder, each
stack's layers, the encoder's below the decoder's): the calls that join a cut
are one block with it, whatever their branches and skips. Inputs that carry
nothing learned (a padding mask fed to every transformer layer, positions),
and learned tensors read again by later layers (an encoder's output, a shared
relative-position table), are not part of the path. A block whose only
learned call is a nested functional or Sequential model is replaced by that
model's own blocks, so a backbone inside a classifier counts embeddings, each
layer, then the head. A block whose variables are all vectors (a
normalization's scale and offset) joins the block before it, and the
embedding layers that come first (token, position, segment: classes named
`*Embedding*`) are one block, as in BEiT's and ELECTRA's layer ids. A layer
that holds a stack of blocks (ViT's encoder) is replaced by its blocks, in the
order it made them.
"""

import typing

import keras

from maskfit import internals
from maskfit.spec import stacks as stacks_lib

__all__ = ["Block", "display_names", "model_blocks"]


class Block(typing.NamedTuple):
    """The layers of one block and the rule that placed them (for the plan's table)."""

    layers: list
    rule: str
    shared: tuple = ()

    def described(self):
        """The rule, with the shared layers placed here at their first use."""
        if not self.shared:
            return self.rule
        return f"{self.rule}; first use of {', '.join(self.shared)}"


def model_blocks(model, stacks="sequential"):
    """Returns the `Block`s of `model`, input side first.

    Only layers with trainable variables are listed; a layer reached twice
    (a shared or tied layer) is in the block nearest the input, whose rule
    names it.

    Raises:
      ValueError: for a model whose graph Keras does not record (a
        subclassed model), one without trainable variables, or one whose
        blocks would share a sublayer (two layers called apart that hold
        the same layer).
    """
    if not _readable(model):
        raise ValueError(
            f"layerwise_decay cannot tell the depth of the layers of model"
            f" '{model.name}' ({type(model).__name__}): only a Sequential or"
            " functional model says how its layers follow each other (a"
            " subclassed model's call() is Python code). Pass its blocks instead:"
            " layerwise_decay([block_1, ..., head], decay), each block a layer or"
            " a list of layers, input side first."
        )
    blocks, seen = [], set()
    for block in _merge(_segments(model, stacks)):
        kept = []
        for layer in block.layers:
            if id(layer) not in seen:
                seen.add(id(layer))
                kept.append(layer)
        if kept:
            blocks.append(block._replace(layers=kept))
    if not blocks:
        raise ValueError(
            f"Model '{model.name}' has no trainable variables, so there is no"
            " learning rate to decay. Make its layers trainable first."
        )
    _check_held_once(model, [b.layers for b in blocks])
    return blocks


def display_names(model, blocks):
    """`{id(layer): name}`, a name two layers share given with the layers it is in.

    Two towers or nested models may hold layers of one name (`embedding`,
    `encoder_block_0`): those are written `outer/inner`, from the model down.
    """
    layers = [x for block in blocks for x in block]
    count = {}
    for layer in layers:
        count[layer.name] = count.get(layer.name, 0) + 1
    parent = {}
    if isinstance(model, keras.layers.Layer):
        stack = [model]
        while stack:
            outer = stack.pop()
            for inner in internals.sublayers(outer, False):
                if id(inner) not in parent:
                    parent[id(inner)] = outer
                    stack.append(inner)
    found = {}
    for layer in layers:
        name, outer = layer.name, parent.get(id(layer))
        if count[layer.name] > 1:
            while outer is not None and outer is not model:
                name = f"{outer.name}/{name}"
                outer = parent.get(id(outer))
        found[id(layer)] = name
    return found


def _check_held_once(model, blocks):
    """Refuses blocks whose layers hold a sublayer another block holds too."""
    owner = {}
    for layer in (x for block in blocks for x in block):
        for inner in [layer] + internals.sublayers(layer):
            if id(inner) in owner and owner[id(inner)] is not layer:
                raise ValueError(
                    f"layerwise_decay cannot give the layers of model '{model.name}'"
                    f" a depth each: layer '{inner.name}' is held by both"
                    f" '{owner[id(inner)].name}' and '{layer.name}', which the"
                    " model calls apart, so no block holds it alone. Pass the"
                    " blocks yourself: layerwise_decay([block_1, ..., head], decay),"
                    " each a layer or a list of layers, input side first."
                )
            owner[id(inner)] = layer


def _readable(model):
    return isinstance(model, keras.Sequential) or isinstance(
        model, internals.functional_class()
    )


def _segments(model, stacks):
    """The blocks of `model`, nested models expanded, before merging vectors."""
    if isinstance(model, keras.Sequential):
        segments = [Block([layer], "cut") for layer in model.layers]
    else:
        segments = [
            Block(found.layers, found.rule, tuple(found.shared))
            for found in stacks_lib.graph_blocks(model, stacks)
        ]
    expanded = []
    for segment in segments:
        learned = [x for x in segment.layers if x.trainable_weights]
        # One layer with the block's matrices (and norms that joined it).
        main = [x for x in learned if not _vectors([x])]
        inner = None
        if len(main) == 1 and _readable(main[0]) and main[0].built:
            inner = [
                b._replace(rule=f"in {main[0].name}: {b.rule}")
                for b in _segments(main[0], stacks)
            ]
        elif len(main) == 1 and _stack(main[0]):
            inner = [Block([x], f"sublayer of {main[0].name}") for x in _stack(main[0])]
        if inner:
            norms = [x for x in learned if x is not main[0]]
            if norms:
                last = inner[-1]
                inner[-1] = last._replace(
                    layers=last.layers + norms, rule=_joined(last.rule)
                )
            expanded += inner
        elif learned:
            expanded.append(segment._replace(layers=learned))
    return expanded


def _stack(layer):
    """The sublayers of a layer that holds a stack of blocks, in order; else None.

    A stack holds two or more sublayers of one class that are blocks
    themselves, holding layers that hold layers (ViT's encoder: its encoder
    blocks, each an attention and an MLP, then a norm), and no variable of its
    own; they are taken in the order the layer tracks them, the order in
    which they were made. A transformer layer's two attentions (self and
    cross, each holding its projections) are not a stack.
    """
    children = [x for x in internals.sublayers(layer, False) if x.trainable_weights]
    blocks = [type(x) for x in children if _nested(x)]
    if not any(blocks.count(kind) > 1 for kind in blocks):
        return None
    covered = {id(v) for x in children for v in x.trainable_weights}
    if covered != {id(v) for v in layer.trainable_weights}:
        return None
    return children


def _nested(layer):
    """Whether `layer` holds a layer that holds layers (two levels of nesting)."""
    return any(internals.sublayers(x, False) for x in internals.sublayers(layer, False))


def _embedding(layer):
    return any("Embedding" in kind.__name__ for kind in type(layer).__mro__)


def _embeddings(layers):
    """Embeddings, with the norms that follow them."""
    return any(_embedding(x) for x in layers) and all(
        _embedding(x) or _vectors([x]) for x in layers
    )


def _vectors(layers):
    return all(len(v.shape) <= 1 for layer in layers for v in layer.trainable_weights)


def _merge(blocks):
    """The leading embeddings are one block; blocks of vectors (norms) join the one
    before."""
    leading = 0
    while leading < len(blocks) and _embeddings(blocks[leading].layers):
        leading += 1
    if leading > 1:
        layers = sum((b.layers for b in blocks[:leading]), [])
        shared = sum((b.shared for b in blocks[:leading]), ())
        blocks = [Block(layers, "leading embeddings", shared)] + blocks[leading:]
    merged = []
    for block in blocks:
        if _vectors(block.layers) and merged:
            last = merged[-1]
            merged[-1] = Block(
                last.layers + block.layers,
                _joined(last.rule),
                last.shared + block.shared,
            )
        else:
            merged.append(block)
    if len(merged) > 1 and _vectors(merged[0].layers):
        # A norm at the input: with what follows.
        first, second = merged[0], merged[1]
        merged[1] = Block(
            first.layers + second.layers,
            _joined(second.rule),
            first.shared + second.shared,
        )
        del merged[0]
    return merged


def _joined(rule):
    suffix = " + norms"
    return rule if rule.endswith(suffix) else rule + suffix
