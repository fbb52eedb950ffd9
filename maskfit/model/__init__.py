"""The masked model classes: training step, persistence, and the classes themselves.

- `training`: `MaskedTraining`, Keras's `train_step` with the masking stage.
- `persistence`: keep masks and the optimizer's layout in weights files,
  masks and rules in the config, pickling.
- `classes`: `MaskedModel` and `MaskedSequential`.
- `conversion`: `masked_model`, any Keras model as one that trains with
  masks (`PrunedModel` runs a subclassed one), for pruning and sparse training.

It imports `internals`, `paths`, `spec`, `optim`, `step` and `backend` (the
step of the backend Keras runs on); the products (`pruning`, `structured`,
`sparse`, `backup`) import it, never the other way.
"""

from maskfit.model.classes import MaskedModel, MaskedSequential
from maskfit.model.conversion import PrunedModel, masked_model
from maskfit.model.persistence import _unpickle  # noqa: F401 (pickles of 0.1.0 name it)
from maskfit.model.training import all_trainable_variables, keep_masks, masker_of

__all__ = [
    "MaskedModel",
    "MaskedSequential",
    "PrunedModel",
    "all_trainable_variables",
    "keep_masks",
    "masked_model",
    "masker_of",
]
