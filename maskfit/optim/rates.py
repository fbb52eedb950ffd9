"""Learning-rate multipliers: an optimizer steps chosen variables at its learning rate x m.

Inside `with scaled_learning_rates(optimizer, multipliers):`, every optimizer
within `optimizer` (a `LossScaleOptimizer`'s inner one, a `MultiOptimizer`'s
sub-optimizers) calls `update_step(gradient, variable, learning_rate * m)`
for each variable given a multiplier `m`, and its decoupled weight decay uses
`learning_rate * m` for it too. For every optimizer Keras ships that is
exactly that variable having its own optimizer at learning rate x m (PyTorch's
parameter groups), since none of them uses the learning rate anywhere else;
`maskfit.optim.rate_modes.KERAS_OPTIMIZERS` says, per class, what else m means
(whether one step is m times the stock step). Variables without a multiplier,
or with one known to be exactly 1 when traced, are stepped by the optimizer's own
code, untouched.

An optimizer class that overrides `update_step` itself is not known to use
its learning rate that way, so there m scales the step instead: each entry
ends `old + m * (updated - old)` (`scale_step`), its state evolving as at
m = 1; a class declares otherwise with `maskfit_multiplier_mode`. The hooks
that do all this are `maskfit.optim.hooks.MultiplierHooks`, shared with the
stateless update (`maskfit.optim.stateless_rates`).

Nothing persists on the optimizer: the hooks are instance attributes, set on
entry and removed on exit, so they act on what is traced (or run eagerly)
inside the `with`.
"""

import contextlib
import threading

import numpy as np
import tensorflow as tf

from maskfit import internals
from maskfit.optim import hooks
from maskfit.optim.rate_modes import LEARNING_RATE, STEP

__all__ = ["LEARNING_RATE", "STEP", "scale_step", "scaled_learning_rates"]


def scale_step(old, updated, multiplier):
    """Returns `old + multiplier * (updated - old)`: `updated` where it is 1, `old` where 0.

    `maskfit.optim.hooks.scale_step` in TensorFlow's ops.

    Args:
      old: the value before a step.
      updated: the value after it.
      multiplier: a tensor that broadcasts to them.

    Example:

    >>> scale_step(tf.constant([1.0, 1.0, 1.0]), tf.constant([3.0, 3.0, 3.0]),
    ...            tf.constant([0.0, 0.5, 1.0])).numpy().tolist()
    [1.0, 2.0, 3.0]
    """
    return hooks.scale_step(old, updated, multiplier, ops=tf)


def _multiplier_tensor(multiplier, variable, gradient=None, positive=False):
    """`multiplier` (a number, tensor or callable) as a float tensor fit for `variable`.

    Called inside the update, so that a callable is read on the device being
    updated. Scalar-sized multipliers become scalars; with an `IndexedSlices`
    gradient, others are broadcast to the variable (Keras gathers their rows).
    """
    m = tf.convert_to_tensor(multiplier() if callable(multiplier) else multiplier)
    if not m.dtype.is_floating:
        m = tf.cast(m, tf.float32)
    shape = tuple(variable.shape)
    try:
        fits = m.shape.rank is None or (
            m.shape.rank <= len(shape)
            and tuple(tf.broadcast_static_shape(m.shape, tf.TensorShape(shape)))
            == shape
        )
    except ValueError:
        fits = False
    if not fits:
        raise ValueError(
            f"The learning-rate multiplier of variable '{_name(variable)}' has shape"
            f" {tuple(m.shape)}, which does not broadcast to the variable's shape"
            f" {shape}. Pass a scalar or an array that broadcasts to {shape}."
        )
    if positive:
        m = tf.where(m > 0, m, tf.ones_like(m))
    if m.shape.rank == 0:
        return m
    if m.shape.num_elements() == 1:
        return tf.reshape(m, [])
    if isinstance(gradient, tf.IndexedSlices):
        return tf.broadcast_to(m, tf.shape(variable))
    return m


def _is_one(multiplier):
    """Whether `multiplier` is None, or known at trace time to be exactly 1.

    Such a variable is stepped by the optimizer's own graph, untouched: TF's
    graph optimizer may round `learning_rate * 1` and the stock graph apart.
    """
    if multiplier is None:
        return True
    if callable(multiplier):
        return False
    value = tf.get_static_value(multiplier)
    return value is not None and bool(np.all(np.asarray(value) == 1))


def _name(variable):
    return getattr(variable, "path", None) or variable.name


class _Scaling(hooks.MultiplierHooks):
    """The hooks on one optimizer while a `scaled_learning_rates` is active.

    Under a `MirroredStrategy` each replica's thread enters the context; the
    threads run in turn up to each merge point, where the optimizer updates
    every replica's variables at once, so the hooks are installed by the
    first thread and removed by the last, and all read the first one's table.
    """

    ops = tf
    snapshot = staticmethod(tf.identity)

    def __init__(self, optimizer, table):
        self.table = table
        self.threads = set()
        super().__init__(optimizer)

    def entry(self, variable):
        multiplier = self.table.get(internals.variable_key(self.optimizer, variable))
        return None if _is_one(multiplier) else multiplier

    def tensor(self, entry, variable, gradient=None):
        return _multiplier_tensor(entry, variable, gradient, self.divides)


_active = {}  # id(optimizer) -> _Scaling
_lock = threading.Lock()


def _steps_itself(optimizer):
    """Whether `optimizer` updates variables itself (it wraps no other optimizer)."""
    return internals.optimizers_within(optimizer) == [optimizer]


@contextlib.contextmanager
def scaled_learning_rates(optimizer, multipliers):
    """Steps each given variable at the optimizer's learning rate x its multiplier.

    Use it around `optimizer.apply` (in the step that is traced, or in each
    eager step). Every optimizer within `optimizer` (a `LossScaleOptimizer`'s,
    a `MultiOptimizer`'s) then passes `learning_rate * m` to its `update_step`
    and its weight decay for each variable with a multiplier `m`
    (`rate_modes.multiplier_mode` says which get `scale_step` instead). Other
    variables are updated exactly as without it.

    Args:
      optimizer: a Keras optimizer, built or not.
      multipliers: `(variable, multiplier)` pairs: a Keras variable or its
        tf.Variable, and a number, a tensor or a zero-argument callable
        returning one, of a shape that broadcasts to the variable (a scalar,
        per column, per entry). A callable is called inside each update, on
        the device of the replica being updated: pass one that reads a
        variable (e.g. a mask that a schedule changes) to follow its value.
        Under `LEARNING_RATE`, an entry whose m is 0 takes no step (but
        Ftrl, which divides by its learning rate, runs it at m = 1), so a
        frozen entry stays where the training step puts it back.

    Raises:
      TypeError: when an optimizer within cannot take multipliers
        (`rate_modes.multiplier_mode`).
      RuntimeError: when the same thread enters it twice for one optimizer.

    Example:

    >>> v = keras.Variable([1.0, 1.0])
    >>> sgd = keras.optimizers.SGD(0.5)
    >>> with scaled_learning_rates(sgd, [(v, 0.1)]):
    ...     sgd.apply([tf.constant([1.0, 1.0])], [v])
    >>> [round(x, 4) for x in v.numpy().tolist()]
    [0.95, 0.95]
    """
    pairs = list(multipliers)
    leaves = [o for o in internals.optimizers_within(optimizer) if _steps_itself(o)]
    if not pairs:
        yield
        return
    for variable, m in pairs:
        _multiplier_tensor(m, variable)  # its shape, before anything moves
    table = {internals.variable_key(leaves[0], variable): m for variable, m in pairs}
    entered = []
    thread = threading.get_ident()
    try:
        for leaf in leaves:
            with _lock:
                scaling = _active.get(id(leaf))
                if scaling is None:
                    scaling = _active[id(leaf)] = _Scaling(leaf, table)
                elif thread in scaling.threads:
                    raise RuntimeError(
                        f"scaled_learning_rates is already active for optimizer"
                        f" '{leaf.name}' in this thread; nest no second one."
                    )
                elif set(scaling.table) != set(table):
                    raise RuntimeError(
                        f"scaled_learning_rates for optimizer '{leaf.name}' was"
                        " entered by another replica with other variables."
                    )
                scaling.threads.add(thread)
                entered.append(scaling)
        yield
    finally:
        with _lock:
            for scaling in reversed(entered):
                scaling.threads.discard(thread)
                if not scaling.threads:
                    scaling.remove()
                    del _active[id(scaling.optimizer)]
