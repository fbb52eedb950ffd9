"""The blocks of a model, input side first: what `layerwise_decay` counts depth over.

A functional graph is cut where every path from the inputs to the outputs
passes through one call (a chain's every layer, a residual block's `Add`, a
transformer layer): the calls between two such cuts are one block, whatever
their branches and skips. Inputs that carry nothing learned (a padding mask fed
to every transformer layer, positions) are not part of the path: they would
otherwise skip every layer. A block whose only learned call is a nested
functional or Sequential model is replaced by that model's own blocks, so a
backbone inside a classifier counts embeddings, each layer, then the head. A
block whose variables are all vectors (a normalization's scale and offset)
joins the block before it, and the embedding layers that come first (token,
position, segment: classes named `*Embedding*`) are one block, as in BEiT's
and ELECTRA's layer ids. A layer that holds a stack of blocks (ViT's encoder)
is replaced by its blocks, in the order it made them.
"""

import keras

from maskfit import internals
from maskfit.internals import graphs

__all__ = ["model_blocks"]

_SOURCE = -1


def model_blocks(model):
    """Returns the blocks of `model`, input side first, each a list of layers.

    Only layers with trainable variables are listed; a layer reached twice
    (a shared or tied layer) is in the block nearest the input.

    Raises:
      ValueError: for a model whose graph Keras does not record (a
        subclassed model), or one without trainable variables.
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
    for block in _merge(_segments(model)):
        kept = [x for x in block if id(x) not in seen]
        seen.update(id(x) for x in kept)
        if kept:
            blocks.append(kept)
    if not blocks:
        raise ValueError(
            f"Model '{model.name}' has no trainable variables, so there is no"
            " learning rate to decay. Make its layers trainable first."
        )
    return blocks


def _readable(model):
    return isinstance(model, keras.Sequential) or isinstance(
        model, internals.functional_class()
    )


def _segments(model):
    """The blocks of `model`, nested models expanded, before merging vectors."""
    if isinstance(model, keras.Sequential):
        segments = [[layer] for layer in model.layers]
    else:
        segments = _graph_segments(model)
    found = []
    for segment in segments:
        learned = [x for x in segment if x.trainable_weights]
        if len(learned) == 1 and _readable(learned[0]) and learned[0].built:
            found += _segments(learned[0])
        elif len(learned) == 1 and _stack(learned[0]):
            found += [[x] for x in _stack(learned[0])]
        elif learned:
            found.append(learned)
    return found


def _stack(layer):
    """The sublayers of a layer that holds a stack of blocks, in order; else None.

    A stack holds two or more sublayers of one class that hold layers
    themselves (ViT's encoder: its encoder blocks, then a norm), and no
    variable of its own; they are taken in the order the layer tracks them,
    the order in which they were made.
    """
    children = [x for x in internals.sublayers(layer, False) if x.trainable_weights]
    composite = [type(x) for x in children if internals.sublayers(x, False)]
    if not any(composite.count(kind) > 1 for kind in composite):
        return None
    covered = {id(v) for x in children for v in x.trainable_weights}
    if covered != {id(v) for v in layer.trainable_weights}:
        return None
    return children


def _graph_segments(model):
    """The layers of a functional model between consecutive cuts of its graph."""
    inputs, calls, outputs = graphs.calls(model)
    producer = {id(t): i for i, (_, _, outs) in enumerate(calls) for t in outs}
    learned, before = [], []
    for operation, ins, _ in calls:
        known = [t for t in ins if id(t) in producer]
        carries = [t for t in known if learned[producer[id(t)]]]
        # Inputs computed from nothing learned (masks, positions) are side
        # inputs: only the learned ones place the call, when it has any.
        path = carries or ins
        before.append({producer.get(id(t), _SOURCE) for t in path} or {_SOURCE})
        learned.append(bool(_weights(operation)) or bool(carries))
    ends = {producer.get(id(t), _SOURCE) for t in outputs}
    on_path = _reaching(before, ends)
    order = [i for i in range(len(calls)) if i in on_path]
    position = {_SOURCE: 0, **{i: p + 1 for p, i in enumerate(order)}}
    sink = len(order) + 1
    edges = [(position[u], position[i]) for i in order for u in before[i]]
    edges += [(position[u], sink) for u in ends]
    cover = [0] * (sink + 2)
    for start, end in edges:
        cover[start + 1] += 1
        cover[end] -= 1
    segments, current, crossing = [], [], 0
    for i in order:
        crossing += cover[position[i]]
        operation = calls[i][0]
        if isinstance(operation, keras.layers.Layer) and operation not in current:
            current.append(operation)
        if crossing == 0:  # every path passes through call i: a block ends
            segments.append(current)
            current = []
    segments.append(current)
    return segments


def _weights(operation):
    return getattr(operation, "trainable_weights", None)


def _reaching(before, ends):
    """The calls from which some model output is reached."""
    found, stack = set(), [i for i in ends if i != _SOURCE]
    while stack:
        i = stack.pop()
        if i not in found:
            found.add(i)
            stack += [u for u in before[i] if u != _SOURCE]
    return found


def _embedding(layer):
    return any("Embedding" in kind.__name__ for kind in type(layer).__mro__)


def _merge(blocks):
    """The leading embeddings are one block; blocks of vectors (norms) join the one
    before."""
    leading = 0
    while leading < len(blocks) and all(_embedding(x) for x in blocks[leading]):
        leading += 1
    if leading > 1:
        blocks = [sum(blocks[:leading], [])] + blocks[leading:]
    merged = []
    for block in blocks:
        vectors = all(
            len(v.shape) <= 1 for layer in block for v in layer.trainable_weights
        )
        if vectors and merged:
            merged[-1] = merged[-1] + block
        else:
            merged.append(list(block))
    if len(merged) > 1 and all(
        len(v.shape) <= 1 for layer in merged[0] for v in layer.trainable_weights
    ):
        merged[1] = merged[0] + merged[1]  # a norm at the input: with what follows
        del merged[0]
    return merged
