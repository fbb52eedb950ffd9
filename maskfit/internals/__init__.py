"""Every private Keras and TensorFlow member maskfit touches, in one place.

Keras 3 has no public API for a few things a drop-in `keras.Model` needs. Each
accessor names the private member it reads, what it is for, what public API is
missing, and the versions it was checked on, in one of six modules:

- `models`: Keras models and layers (the functional class, the loss wrapper,
  the layer walk, `fit`'s start epoch) and TensorFlow's tracing (XLA context,
  cross-replica calls);
- `optimizers`: what an optimizer was built for, its slots, EMA averages,
  rebuilding it in place, the hooks of learning-rate multipliers;
- `data`: `fit`'s input and epoch bookkeeping, and tf.data pipelines (the
  exact backup);
- `graphs`: a functional or Sequential model's layer calls and their
  arguments (structured pruning's graph, layer-wise depth);
- `jax_trainer`: Keras's JAX trainer (its metrics update, the function
  `fit` calls, the state's shardings, a callback's model without the sync
  of the trainer's state);
- `torch_trainer`: Keras's PyTorch trainer (its `make_train_function`) and
  the per-variable update loop its optimizers replace.

Each module lists its members in its `PRIVATE_MEMBERS` (where, member, what
it is for), says in its docstring the releases it checked them on, and
finds those an install lacks (`missing_members`). `PRIVATE_MEMBERS` here
lists them all; `tests/test_internals.py` fails with the member's name when a
Keras or TensorFlow release removes one. No other maskfit module names a
private member: `tests/test_internals.py` scans them.

It imports Keras, TensorFlow and the standard library only: every other
package of maskfit may import it.
"""

from maskfit.internals import (
    data,
    graphs,
    jax_trainer,
    models,
    optimizers,
    torch_trainer,
)
from maskfit.internals.models import (
    application_layer_classes,
    attention_output_dense,
    call_has_training_arg,
    compute_loss,
    conv_lstm_cell_class,
    defining_class,
    functional_class,
    loss_tracker,
    merge_call,
    set_method,
    set_untracked,
    shapes_only,
    sublayers,
    tracing_for_xla,
    unscale_loss_for_distribution,
)
from maskfit.internals.optimizers import (
    OptimizerStructure,
    ema_averages_by_variable,
    hook_current_learning_rate,
    hook_weight_decay,
    optimizer_built_variables,
    optimizer_state,
    optimizers_within,
    reset_optimizer,
    variable_key,
    weight_decay_owner,
)

__all__ = [
    "PRIVATE_MEMBERS",
    "OptimizerStructure",
    "application_layer_classes",
    "attention_output_dense",
    "call_has_training_arg",
    "compute_loss",
    "conv_lstm_cell_class",
    "data",
    "defining_class",
    "ema_averages_by_variable",
    "functional_class",
    "graphs",
    "hook_current_learning_rate",
    "hook_weight_decay",
    "jax_trainer",
    "loss_tracker",
    "merge_call",
    "missing_members",
    "models",
    "optimizer_built_variables",
    "optimizer_state",
    "optimizers",
    "optimizers_within",
    "reset_optimizer",
    "set_method",
    "set_untracked",
    "shapes_only",
    "sublayers",
    "torch_trainer",
    "tracing_for_xla",
    "unscale_loss_for_distribution",
    "variable_key",
    "weight_decay_owner",
]

_MODULES = (models, optimizers, data, graphs, jax_trainer, torch_trainer)
PRIVATE_MEMBERS = tuple(m for module in _MODULES for m in module.PRIVATE_MEMBERS)


def missing_members():
    """Returns `[(where, member)]` for every listed member this install lacks."""
    return [missing for module in _MODULES for missing in module.missing_members()]
