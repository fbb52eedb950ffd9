"""What `prune_oneshot` did: per layer, what went and what it cost the layer's output."""

import dataclasses

__all__ = ["LayerReport", "OneShotReport"]


@dataclasses.dataclass(frozen=True)
class LayerReport:
    """One pruned kernel.

    Attributes:
      layer: the layer's path (`block/sublayer`).
      kernel: the kernel variable's path.
      shape: the kernel's shape; `matrix`: its `(in, out)` view.
      pruned: entries set to 0 and frozen by the layer's `ElementMask`.
      size: the kernel's entries.
      error: the layer's output error on the calibration tokens,
        `||X (W - W')||^2 / ||X W||^2` (0 is exact; what SparseGPT minimizes).
      seconds: the time its pruning took (not its calibration).

    Example:

    >>> import keras, maskfit, numpy as np
    >>> model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    >>> x = [np.random.default_rng(0).normal(size=(16, 4)).astype("float32")]
    >>> row = maskfit.prune_oneshot(model, x, "wanda", sparsity=0.5).layers[0]
    >>> row.kernel, row.matrix, row.pruned, row.sparsity
    ('sequential/dense/kernel', (4, 2), 4, 0.5)
    """

    layer: str
    kernel: str
    shape: tuple
    matrix: tuple
    pruned: int
    size: int
    error: float
    seconds: float

    @property
    def sparsity(self):
        return self.pruned / self.size


@dataclasses.dataclass(frozen=True)
class OneShotReport:
    """The result of `maskfit.oneshot.prune_oneshot`.

    Attributes:
      method: "magnitude", "wanda" or "sparsegpt".
      target: the sparsity ("50%") or N:M pattern ("2:4") asked for.
      layers: a `LayerReport` per pruned kernel, in block order.
      refused: `{layer path: why it was left dense}`.
      blocks: the number of blocks calibrated in turn.
      tokens: calibration tokens (rows of the first block's input).
      chained: whether each block's inputs were the previous block's outputs
        (else the model ran up to each block).
      seconds: the whole one-shot pass, calibration included.

    Example:

    >>> import keras, maskfit, numpy as np
    >>> model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(8),
    ...                           keras.layers.Dense(2)])
    >>> x = [np.random.default_rng(0).normal(size=(16, 8)).astype("float32")]
    >>> report = maskfit.prune_oneshot(model, x, "magnitude", pattern="4:8")
    >>> report.target, report.pruned, report.size, report.blocks, report.tokens
    ('4:8', 40, 80, 2, 16)
    >>> print(report.table().splitlines()[0][:52])
    magnitude at 4:8: 40 of 80 kernel entries pruned (50
    """

    method: str
    target: str
    layers: tuple
    refused: dict
    blocks: int
    tokens: int
    chained: bool
    seconds: float

    @property
    def pruned(self):
        """Entries pruned over all pruned kernels."""
        return sum(row.pruned for row in self.layers)

    @property
    def size(self):
        """Entries of all pruned kernels."""
        return sum(row.size for row in self.layers)

    @property
    def sparsity(self):
        """The pruned kernels' sparsity together."""
        return self.pruned / max(self.size, 1)

    def table(self):
        """The report as a Markdown table, one row per layer, then the refusals."""
        lines = [
            f"{self.method} at {self.target}: {self.pruned} of {self.size} kernel"
            f" entries pruned ({self.sparsity:.2%}) in {len(self.layers)} layers of"
            f" {self.blocks} blocks, {self.seconds:.2f} s",
            "",
            "| layer | (in, out) | sparsity | output error |",
            "| --- | --- | --- | --- |",
        ]
        lines += [
            f"| {r.layer} | {r.matrix} | {r.sparsity:.2%} | {r.error:.4g} |"
            for r in self.layers
        ]
        lines += [f"refused {name}: {why}" for name, why in self.refused.items()]
        return "\n".join(lines)
