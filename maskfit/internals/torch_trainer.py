"""Private members of Keras's PyTorch trainer and optimizers that maskfit's torch backend uses.

Checked on Keras 3.15.1 with torch 2.14.1.
"""

import importlib

from maskfit.internals.models import set_method

_TRAINER = "keras.src.backend.torch.trainer"
_BASE_OPTIMIZER = "keras.src.optimizers.base_optimizer"
_TORCH_OPTIMIZERS = "keras.src.backend.torch."
_OPTIMIZER_MODULES = "keras.src.backend.torch.optimizers."

# (where, member, what it is for).
PRIVATE_MEMBERS = (
    (
        f"{_TRAINER}.TorchTrainer",
        "make_train_function",
        "the torch trainer's own `make_train_function` (one step per call,"
        " `torch.compile` under `jit_compile=True`), which `MaskedModel`"
        " overrides and calls past its own override; no public way to call the"
        " trainer's version from a subclass that sits before it in the MRO.",
    ),
    (
        f"{_BASE_OPTIMIZER}.BaseOptimizer",
        "_backend_update_step",
        "Keras's per-variable update loop (`update_step` for each variable):"
        " the torch optimizers replace it with one `torch._foreach_*` update of"
        " all variables, which skips `update_step`, so the step of a variable"
        " with a learning-rate multiplier runs the per-variable loop instead.",
    ),
    (
        f"{_BASE_OPTIMIZER}.BaseOptimizer",
        "_apply_weight_decay",
        "Keras's per-variable decoupled weight decay: the torch optimizers"
        " decay all variables with one `torch._foreach_mul_` by a scalar, which"
        " cannot take a per-entry learning rate, so a step with multipliers"
        " decays per variable instead.",
    ),
    (
        "torch.Tensor",
        "_version",
        "torch's count of in-place writes to a tensor: the torch guard"
        " (`maskfit.backend.torch_guard`) takes a frozen entry's bits again"
        " only when something other than the update wrote the tensor since its"
        " last restore; no public way to ask whether a tensor was written.",
    ),
    *(
        (
            f"{_OPTIMIZER_MODULES}torch_{name.lower()}",
            name,
            f"Keras's own torch {name}: the torch guard fills the frozen entries"
            " of its second moments (`SQRT_SLOTS`) only in this exact class, never"
            " in a subclass, whose update may read other entries.",
        )
        for name in ("Adam", "AdamW", "Nadam")
    ),
    *(
        (
            "keras.optimizers.Adam (built, amsgrad=True)",
            attribute,
            "the attribute in which Adam, AdamW and Nadam keep their second"
            " moments (and amsgrad's maximum of them), whose `sqrt` the update"
            " takes: the torch guard fills their frozen entries with 1.0 before"
            " the update (torch's CPU `sqrt` is slower on zeros) and restores them."
            " Renamed, the fill does not happen (slower, still exact).",
        )
        for attribute in ("_velocities", "_velocity_hats")
    ),
    (
        "keras.optimizers.Adam (built, amsgrad=True)",
        "_momentums",
        "the attribute in which Adam, AdamW and Nadam keep their first moments,"
        " which their torch update scales and adds the gradient to (`m = m * b1`,"
        " `m += g * (1 - b1)`): a frozen entry that is +0.0 stays +0.0 under a"
        " +0.0 gradient, so the torch guard skips its restore (`ZERO_SLOTS`)."
        " Renamed, the restore runs (slower, still exact).",
    ),
)

# The second-moment slots, by optimizer attribute, of the exact classes whose
# update reads each entry of them only for that entry (and takes its `sqrt`).
SQRT_SLOTS = {
    "Adam": ("_velocities", "_velocity_hats"),
    "AdamW": ("_velocities", "_velocity_hats"),
    "Nadam": ("_velocities",),
}

# The first-moment slots, by optimizer attribute, of the exact classes whose
# update of an entry is `m * b1 + g * (1 - b1)`: +0.0 stays +0.0 bit for bit
# where the gradient is +0.0 (every product and sum of +0.0 is +0.0).
ZERO_SLOTS = {
    "Adam": ("_momentums",),
    "AdamW": ("_momentums",),
    "Nadam": ("_momentums",),
}


def is_own_torch_optimizer(optimizer):
    """Whether `optimizer`'s class is Keras's own torch class of its name (no subclass)."""
    name = type(optimizer).__name__
    return type(optimizer).__module__ == f"{_OPTIMIZER_MODULES}torch_{name.lower()}"


def _trainer():
    return importlib.import_module(_TRAINER).TorchTrainer


def make_train_function(model, force=False):
    """Keras's torch `make_train_function` for `model` (its `train_step` is called)."""
    return _trainer().make_train_function(model, force=force)


def _generic(optimizer, name):
    """`name` of the first class in `optimizer`'s MRO that is not torch's own."""
    for cls in type(optimizer).__mro__:
        if name in vars(cls) and not cls.__module__.startswith(_TORCH_OPTIMIZERS):
            return vars(cls)[name]
    raise AttributeError(f"{type(optimizer).__name__} has no {name}")


def per_variable_update(optimizer, ids):
    """Makes `optimizer` update and decay the variables in `ids` one by one.

    Keras's torch optimizers update (and decay) every variable at once with
    `torch._foreach_*` ops, which skip `update_step` and take one scalar
    learning rate. The variables whose `id` is in `ids` get the optimizer's
    own backend-independent code instead (its `update_step`, as Keras's base
    class runs it; its `_apply_weight_decay`); the others keep the fused
    update, bit for bit. Returns a function that undoes it.
    """
    fused_update = optimizer._backend_update_step
    fused_decay = optimizer._apply_weight_decay
    generic_update = _generic(optimizer, "_backend_update_step")
    generic_decay = _generic(optimizer, "_apply_weight_decay")

    def update(grads, variables, learning_rate):
        pairs = list(zip(grads, variables))
        plain = [(g, v) for g, v in pairs if id(v) not in ids]
        if not plain:
            return generic_update(optimizer, grads, variables, learning_rate)
        fused_update([g for g, _ in plain], [v for _, v in plain], learning_rate)
        for gradient, variable in pairs:
            if id(variable) in ids:
                optimizer.update_step(gradient, variable, learning_rate)

    def decay(variables):
        plain = [v for v in variables if id(v) not in ids]
        if plain:
            fused_decay(plain)
        scaled = [v for v in variables if id(v) in ids]
        if scaled:
            generic_decay(optimizer, scaled)

    undo = [
        set_method(optimizer, "_backend_update_step", update),
        set_method(optimizer, "_apply_weight_decay", decay),
    ]

    def undo_all():
        for each in reversed(undo):
            each()

    return undo_all


def tensor_version(tensor):
    """How many in-place writes `tensor` has had (torch's version counter)."""
    return tensor._version


def missing_members():
    """Returns `[(where, member)]` for every listed member this install lacks.

    Nothing is missing where torch is not installed: the members are then
    never called.
    """
    try:
        trainer = _trainer()
    except ImportError:
        return []
    base = importlib.import_module(_BASE_OPTIMIZER).BaseOptimizer
    import keras
    import torch

    adam = keras.optimizers.Adam(amsgrad=True)
    adam.build([keras.Variable([0.0])])  # the slots are made in `build`
    owners = {
        f"{_TRAINER}.TorchTrainer": trainer,
        f"{_BASE_OPTIMIZER}.BaseOptimizer": base,
        "torch.Tensor": torch.zeros(()),  # `_version` is an instance's
        "keras.optimizers.Adam (built, amsgrad=True)": adam,
    }
    for name in SQRT_SLOTS:
        where = f"{_OPTIMIZER_MODULES}torch_{name.lower()}"
        owners[where] = importlib.import_module(where)
    return [(w, m) for w, m, _ in PRIVATE_MEMBERS if not hasattr(owners[w], m)]
