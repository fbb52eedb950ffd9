"""maskfit.oneshot: one-shot post-training pruning of language models (Wanda, SparseGPT).

`prune_oneshot(model, calibration, "sparsegpt", pattern="2:4")` prunes every
Dense / EinsumDense kernel of a model's blocks from a few calibration
batches, block by block, and declares `ElementMask`s that freeze the zeros,
so healing with `MaskedModel.fit` keeps them bit for bit. The modules:
`targets` (the request, checked), `views` (a kernel as its `(in, out)`
matrix), `calibrate` (blocks, their inputs, each kernel's `X^T X`), `nm`
(which entries go), `wanda` (magnitude and Wanda), `sparsegpt`, `report`,
`prune`, `lora` (`merge_lora`: LoRA merged without filling the zeros). docs/oneshot.md has the method and the measurements.

It imports `spec` (the masks), `checks` and `internals`; the math is NumPy.
"""

from maskfit.oneshot.lora import LoraMerge, merge_lora
from maskfit.oneshot.prune import prune_oneshot
from maskfit.oneshot.report import LayerReport, OneShotReport
from maskfit.oneshot.targets import METHODS

__all__ = [
    "LayerReport",
    "LoraMerge",
    "merge_lora",
    "METHODS",
    "OneShotReport",
    "prune_oneshot",
]
