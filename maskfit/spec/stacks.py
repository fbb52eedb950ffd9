"""The blocks of a functional graph, one stack or several, input side first.

What `maskfit.spec.depth` cuts a functional model's graph with. A call is a
*cut* of an input when every path from that input to the outputs passes
through it: in a chain of layers every layer is one, in a residual block only
the call that adds the branch back, in a transformer every layer. The cuts of
each input are found on their own and pooled, so an encoder-decoder has the
encoder's layers (cuts of the encoder's inputs) and the decoder's layers
(cuts of the decoder's inputs) although no one call separates them all.

Paths follow what the computation reads, less two kinds of side input:

- an input computed from nothing learned (a padding mask, positions) of a call
  that also reads something learned;
- a tensor that an earlier call on the way already read, when read again by a
  call with variables of its own: the encoder's output read by every decoder
  layer's cross-attention, a relative-position table or a shared attention
  bias read by every layer. Its first reader keeps the edge, so the table
  joins the block of its first use. A merge without variables (`Add`,
  `Concatenate`) keeps every edge: that is how a residual block ends;
- a model output that calls on the way to another output also read (an
  encoder-decoder backbone returns its encoder's output too).

Every other call joins the first cut that every path from it reaches (a
residual branch joins its `Add`); a cut whose calls hold only vectors (a norm)
joins the cut before it. The blocks are then ordered, input side first:

- `stacks="sequential"` (the default): one depth per block. Each cut is placed
  as late as it can be (by its longest path to the outputs), so a stack that
  another reads (an encoder) comes whole before the stack reading it; of two
  cuts as far from the outputs, the one with more cuts before it comes first
  (the longer stack), and the embeddings the inputs start with come first of
  all. An encoder-decoder reads: embeddings < encoder 0 < ... < encoder n <
  decoder 0 < ... < decoder m < head. Two towers joined at the head
  interleave, each in its own order.
- `stacks="parallel"`: depth counted from the outputs along each stack (the
  longest path to the outputs), one depth per count: the i-th layer from the
  top of each tower shares a depth, and an encoder's last layer sits one below
  the first decoder layer reading it.

A tensor read again through a merge without variables (a long skip
connection, as in a U-Net) is a skip, not a side input: the layers it spans
are one block.
"""

import keras

from maskfit.internals import graphs

__all__ = ["STACKS", "GraphBlock", "graph_blocks"]

# The orders `layerwise_decay(..., stacks=)` takes.
STACKS = ("sequential", "parallel")


class GraphBlock:
    """The layers of one cut (and the calls that join it), with what placed it.

    Attributes:
      layers: the Keras layers called, in Keras's call order (a layer called
        twice is listed once).
      rule: why these calls are one block, for `LayerwisePlan`'s table.
      shared: the names of layers also called in a later block.
    """

    def __init__(self, layers, rule, shared):
        self.layers, self.rule, self.shared = layers, rule, shared


def graph_blocks(model, stacks="sequential"):
    """`[GraphBlock]` of a functional model's graph, input side first."""
    inputs, calls, outputs = graphs.calls(model)
    graph = _Graph(inputs, calls, outputs)
    on_path = graph.reaching_outputs()
    cuts = graph.cuts(on_path)
    ahead = graph.levels(cuts, on_path)
    behind = graph.levels(cuts, on_path, backward=True)
    owner = graph.owning_cut(cuts, on_path)
    joined = _join_vectors(owner, cuts, graph, on_path)
    groups = {}
    for i in sorted(on_path):
        groups.setdefault(owner.get(i), []).append(i)
    if stacks == "parallel":
        # Counted from the outputs: the i-th cut from each stack's top shares
        # a depth; the calls after the last cut are level -1.
        merged = {}
        for key in groups:
            merged.setdefault(-1 if key is None else behind[key], []).append(key)
        ordered = [
            (sorted(i for k in merged[lvl] for i in groups[k]), merged[lvl])
            for lvl in sorted(merged, reverse=True)
        ]
    else:
        # As late as each cut can be (its longest path to the outputs), so a
        # stack that another reads comes whole before it; of two cuts as far
        # from the outputs, the one with more cuts before it first (the
        # longer stack); the embeddings the inputs start with first of all.
        stems = _stems(groups, graph, on_path, calls)
        order = sorted(
            (key for key in groups if key is not None),
            key=lambda k: (k not in stems, -behind[k], -ahead[k], k),
        )
        ordered = [(groups[k], [k]) for k in order]
        if None in groups:
            ordered.append((groups[None], [None]))
    blocks, uses = [], {}
    for members, keys in ordered:
        layers = []
        for i in members:
            operation = calls[i][0]
            if isinstance(operation, keras.layers.Layer) and operation not in layers:
                layers.append(operation)
        for layer in layers:
            uses.setdefault(id(layer), []).append(len(blocks))
        rule = _rule(keys, cuts, graph)
        if any(k in joined for k in keys):
            rule += " + norms"
        blocks.append(GraphBlock(layers, rule, []))
    for index, block in enumerate(blocks):
        # Reached again in a later block: placed here, at its first use.
        block.shared = [
            x.name
            for x in block.layers
            if x.trainable_weights and uses[id(x)][0] == index < uses[id(x)][-1]
        ]
    return blocks


def _join_vectors(owner, cuts, graph, on_path):
    """A cut whose calls hold only vectors (a norm) joins the cut before it."""
    layers = {}
    for i, key in owner.items():
        weights = getattr(graph.calls[i][0], "trainable_weights", None) or []
        layers.setdefault(key, []).extend(weights)
    before = graph.cut_before(cuts, on_path)
    joined = set()
    for key in sorted(layers, reverse=True):
        if all(len(v.shape) <= 1 for v in layers[key]) and before.get(key) is not None:
            target = before[key]
            for i, current in owner.items():
                if current == key:
                    owner[i] = target
            if layers[key]:
                joined.add(target)
    return joined


def _stems(groups, graph, on_path, calls):
    """The cuts of embeddings (and their norms) that only embeddings come before."""
    embedded = set()
    for key, members in groups.items():
        if key is None:
            continue
        layers = [calls[i][0] for i in members]
        weights = [x for x in layers if getattr(x, "trainable_weights", None)]
        if any(_embedding(x) for x in weights) and all(
            _embedding(x) or all(len(v.shape) <= 1 for v in x.trainable_weights)
            for x in weights
        ):
            embedded.add(key)
    owner = {i: k for k, members in groups.items() for i in members}
    other = {}  # call -> whether a cut other than a stem comes before it
    for i in sorted(on_path):
        other[i] = any(
            other[u] or (owner.get(u) is not None and owner[u] not in embedded)
            for u in graph.before[i]
            if u >= 0 and u in other and owner.get(u) != owner.get(i)
        )
    return {k for k in embedded if not any(other[i] for i in groups[k])}


def _embedding(layer):
    return any("Embedding" in kind.__name__ for kind in type(layer).__mro__)


def _rule(keys, cuts, graph):
    """Which cut placed a block: every input's, some inputs', or none (the tail)."""
    found = set()
    for key in keys:
        if key is None:
            return "after the last cut"
        found |= cuts[key]
    if len(found) == graph.learned_sources:
        return "cut"
    names = ", ".join(sorted(graph.input_names[-1 - s] for s in found))
    return f"cut of {names}"


class _Graph:
    """The calls of a functional graph, with the edges paths follow."""

    def __init__(self, inputs, calls, outputs):
        self.calls = calls
        self.input_names = [
            graphs.input_name(t) or f"input {k}" for k, t in enumerate(inputs)
        ]
        source = {id(t): -1 - k for k, t in enumerate(inputs)}
        producer = {id(t): i for i, (_, _, outs) in enumerate(calls) for t in outs}
        self.before = []  # per call: the calls (or -1 - input) its paths come from
        learned, ancestors, readers = [], [], {}
        for i, (operation, ins, _) in enumerate(calls):
            own = bool(getattr(operation, "trainable_weights", None))
            known = [t for t in ins if id(t) in producer]
            carries = [t for t in known if learned[producer[id(t)]]]
            seen = 0
            for t in known:
                seen |= ancestors[producer[id(t)]] | (1 << producer[id(t)])
            ancestors.append(seen)
            path = carries or ins
            if own and len(path) > 1:
                # Read again by a call with variables, after an earlier reader
                # on the way: a side input (see the module docstring).
                fresh = [
                    t
                    for t in path
                    if not any(seen >> r & 1 for r in readers.get(id(t), ()) if r != i)
                ]
                path = fresh or path
            for t in ins:
                readers.setdefault(id(t), []).append(i)
            origin = {
                producer[id(t)] if id(t) in producer else source.get(id(t))
                for t in path
            }
            self.before.append({u for u in origin if u is not None} or {-1})
            learned.append(own or bool(carries))
        self.ends = {producer.get(id(t), source.get(id(t), -1)) for t in outputs}
        self.learned_sources = 0
        # An output that calls on the way to an output also read (an encoder's
        # output, an attention mask the backbone returns): a side input of the
        # outputs, like any tensor read again.
        reaching = self.reaching_outputs()
        self.ends = {
            producer.get(id(t), source.get(id(t), -1))
            for t in outputs
            if not any(r in reaching for r in readers.get(id(t), ()))
        } or self.ends

    def reaching_outputs(self):
        """The calls from which an output is reached along paths."""
        found, stack = set(), [i for i in self.ends if i >= 0]
        while stack:
            i = stack.pop()
            if i not in found:
                found.add(i)
                stack += [u for u in self.before[i] if u >= 0]
        return found

    def cuts(self, on_path):
        """`{call: the inputs it is a cut of}`: the cuts of each input, pooled."""
        sources = sorted({u for i in on_path for u in self.before[i] if u < 0})
        found = {}
        for s in sources:
            reached = set()
            for i in sorted(on_path):
                if any(u == s or u in reached for u in self.before[i]):
                    reached.add(i)
            for i in self._cuts_from(s, reached):
                found.setdefault(i, set()).add(s)
        self.learned_sources = len(sources)
        return found

    def _cuts_from(self, s, reached):
        """The calls every path from input `s` to the outputs passes through."""
        order = sorted(reached)
        position = {s: 0, **{i: p + 1 for p, i in enumerate(order)}}
        sink = len(order) + 1
        edges = [
            (position[u], position[i])
            for i in order
            for u in self.before[i]
            if u in position
        ]
        edges += [(position[u], sink) for u in self.ends if u in position]
        if not any(end == sink for _, end in edges):
            return []
        cover = [0] * (sink + 2)
        for start, end in edges:
            cover[start + 1] += 1
            cover[end] -= 1
        found, crossing = [], 0
        for i in order:
            crossing += cover[position[i]]
            if crossing == 0:
                found.append(i)
        return found

    def levels(self, cuts, on_path, backward=False):
        """`{cut: level}`: cuts before it on the longest path from an input (or,
        `backward`, after it on the longest path to an output)."""
        best, level = {}, {}
        if not backward:
            for i in sorted(on_path):
                below = [
                    level[u] if u in cuts else best[u]
                    for u in self.before[i]
                    if u >= 0 and u in best
                ]
                best[i] = max(below, default=-1)
                if i in cuts:
                    level[i] = best[i] + 1
            return level
        after = {i: [] for i in on_path}
        for i in on_path:
            for u in self.before[i]:
                if u in after:
                    after[u].append(i)
        for i in sorted(on_path, reverse=True):
            above = [level[v] if v in cuts else best[v] for v in after[i]]
            best[i] = max(above, default=-1)
            if i in cuts:
                level[i] = best[i] + 1
        return level

    def cut_before(self, cuts, on_path):
        """`{cut: the nearest cut every path to it passes through}` (None: none)."""
        behind = {}  # call -> the cuts every path to it passes through
        for i in sorted(on_path):
            common = None
            for u in self.before[i]:
                reached = behind.get(u, set()) if u >= 0 else set()
                common = set(reached) if common is None else common & reached
            behind[i] = common or set()
            if i in cuts:
                behind[i] = behind[i] | {i}
        return {c: max(behind[c] - {c}, default=None) for c in cuts}

    def owning_cut(self, cuts, on_path):
        """`{call: the first cut every path from it reaches}` (a cut owns itself)."""
        after = {i: [] for i in on_path}
        for i in on_path:
            for u in self.before[i]:
                if u in after:
                    after[u].append(i)
        ahead = {}  # call -> the cuts every path from it passes through
        for i in sorted(on_path, reverse=True):
            common = None
            for v in after[i]:
                common = set(ahead[v]) if common is None else common & ahead[v]
            if i in self.ends or common is None:
                common = set()
            ahead[i] = common | ({i} if i in cuts else set())
        return {i: min(ahead[i]) for i in on_path if ahead[i]}
