"""The guard of the torch update: frozen entries put back with bit operations.

Keras's torch optimizers update every variable in place, so the frozen
entries of a masked variable, of its optimizer slots of its shape and of its
EMA average are put back after `optimizer.apply`. `Guard` does it with
integer views of the raw bits, in place: each tensor `t` is restored as
`t = kept + t * keep` in one pass (`torch.addcmul` written into `t`), where
`keep` is 1 where an entry learns and 0 where it is frozen, and `kept` holds
the frozen entries' bits from before the update (zeros elsewhere). One of
the two terms is always 0, so the integer arithmetic never overflows: it is
exact for every value, -0.0 and each NaN payload included, with no
allocation. One pass rather than two (`(t & mask) | kept`) because each
elementwise op over a large tensor is one parallel region of torch's thread
pool, and on a loaded machine each region costs far more than its bytes
(`docs/benchmarks.md`, the torch table).

The kept bits are taken once and reused across steps: after each restore,
the guard notes the tensor's version counter (`Tensor._version`, bumped by
every in-place write), and takes the bits again only when something else
wrote to the tensor since (`assign`, a load, another optimizer). A variable
or slot whose mask is all ones is not held at all, and a tensor the update
left untouched is not restored. Everything a step needs per variable is
worked out once per mask version and interval, when the `Guard` is built.

Adam's, AdamW's and Nadam's second moments are 0 at entries that never
learned, and torch's CPU `sqrt` is several times slower on zeros than on
other values (`docs/benchmarks.md`). Their held second-moment slots get
1.0 written into their frozen entries just before the update (after their
bits are kept), so the update's `sqrt` sees no zeros there; the restore puts
the kept bits back, as for any slot. The fill has the restore's form,
`t = ones + t * keep` on the raw bits, with `ones` holding 1.0's bits where
frozen (0 elsewhere, made once per variable and shared by its slots): one
integer `addcmul`, a tenth of a `masked_fill_` with the bool mask on the
CPU (`docs/benchmarks.md`). This only changes what the update
computes at frozen entries, all of which are restored: in these optimizers'
updates an entry reads no other entry (no norm over the tensor, unlike LAMB),
and the classes are matched exactly, since a subclass may change the update.

Their first moments need no restore while their frozen entries are +0.0:
the update computes `m * b1 + g * (1 - b1)`, and the guard has made every
frozen gradient entry +0.0 (all bits clear), so +0.0 stays +0.0 bit for
bit. Whether a held first-moment slot's frozen entries are all +0.0 is
read when its bits are taken (a mask that froze entries which had learned
leaves them nonzero: those are restored). This skips one pass per masked
variable under Adam, AdamW and Nadam (exact classes,
`internals.torch_trainer.ZERO_SLOTS`), and only in a step whose gradients
are the very tensors `mask_gradients` returned, unwritten since (their
version counters): a `MaskedModel.apply_grad_masks` of the user's may return
other values (`zeroed`).

A tensor whose frozen bits are all 0 when taken (a second moment that never
learned) is restored by `mul_(keep)` and filled by `add_(ones)`: two operands,
less memory traffic (the passes are bound by it; `docs/benchmarks.md`).
"""

import keras
import torch

from maskfit import internals
from maskfit.step import stateless

__all__ = ["Guard", "copied", "int_view", "sqrt_slots", "zero_slots"]

_INT = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def int_view(tensor):
    """`tensor`'s bits as signed integers of its element size (a view, no copy)."""
    return tensor.view(_INT[tensor.element_size()])


def sqrt_slots(optimizer):
    """The ids of the slots within `optimizer` whose frozen entries may be filled.

    Those the update takes the `sqrt` of, in optimizers where an entry's update
    reads no other entry (`internals.torch_trainer.SQRT_SLOTS`, exact classes only).
    """
    return _slot_ids(optimizer, internals.torch_trainer.SQRT_SLOTS)


def zero_slots(optimizer):
    """The ids of the slots within `optimizer` whose +0.0 entries stay +0.0.

    Those an update moves only by `m * b1 + g * (1 - b1)`
    (`internals.torch_trainer.ZERO_SLOTS`, exact classes only): where the
    gradient is +0.0, a +0.0 entry is not written to any other value.
    """
    return _slot_ids(optimizer, internals.torch_trainer.ZERO_SLOTS)


def _slot_ids(optimizer, table):
    """The ids of the slots named by `table` (class name: attributes) in `optimizer`."""
    found = set()
    for each in internals.optimizers_within(optimizer):
        attributes = table.get(type(each).__name__, ())
        # Keras's own torch class (`torch_adam.Adam`...), never a subclass.
        own = internals.torch_trainer.is_own_torch_optimizer(each)
        if not (attributes and own and each.built):
            continue
        slots, _ = internals.optimizer_state(each)
        found.update(id(s) for (name, _), s in slots.items() if name in attributes)
    return frozenset(found)


def _keep_ones(frozen, dtype):
    """1 where an entry learns, 0 where frozen, as integers of `dtype`'s size."""
    int_dtype = _INT[torch.empty((), dtype=dtype).element_size()]
    return torch.logical_not(frozen).to(int_dtype)


def _one_bits(dtype, keep):
    """1.0's bits of `dtype` where `keep` is 0 (frozen), 0 elsewhere."""
    one = int_view(torch.ones((), dtype=dtype, device=keep.device))
    return (1 - keep) * one


class _Kept:
    """One tensor's frozen bits, with the version counter at which they hold."""

    __slots__ = tuple("source tensor keep bits version fill stays clear".split())

    def __init__(self, source, keep, fill=None, stays=False):
        self.source = source  # the Keras variable; its tensor may be replaced
        self.tensor = source.value
        self.keep = keep  # 1 where it learns, 0 where frozen; None: held whole
        self.bits = None
        self.version = -1
        self.fill = fill  # 1.0's bits where frozen, 0 elsewhere; None: no fill
        # +0.0 stays +0.0 under the update (never for a filled slot: 1.0 moves)
        self.stays = stays and keep is not None and fill is None
        self.clear = False  # every frozen entry +0.0 (all bits 0) when taken

    def take(self):
        """Reads the frozen bits again when the tensor was written since the last restore."""
        tensor = self.source.value
        if tensor is not self.tensor:
            self.tensor, self.bits = tensor, None
        if (
            self.bits is not None
            and internals.torch_trainer.tensor_version(tensor) == self.version
        ):
            return
        if self.keep is None:
            self.bits = tensor.detach().clone()
        else:
            self.bits = int_view(tensor) * (1 - self.keep)
        self.clear = self.keep is not None and not bool(self.bits.any())
        self.version = internals.torch_trainer.tensor_version(tensor)

    def fill_frozen(self):
        """Writes 1.0 into the frozen entries (kept already; the restore puts them back)."""
        if self.fill is not None:
            view = int_view(self.tensor)
            if self.clear:  # 0 + 1.0's bits where frozen, + 0 elsewhere
                view.add_(self.fill)
            else:
                torch.addcmul(self.fill, view, self.keep, out=view)

    def restore(self, bits=None, zeroed=False):
        """Puts the frozen bits back (`bits`: another tensor's, for an EMA average).

        `zeroed`: every frozen gradient entry was +0.0, so a tensor whose frozen
        entries were +0.0 and `stays` holds them still (nothing to write).
        """
        tensor = self.tensor
        if bits is None:
            if internals.torch_trainer.tensor_version(tensor) == self.version:
                return  # the update did not write it
            if zeroed and self.stays and self.clear:
                self.version = internals.torch_trainer.tensor_version(tensor)
                return
            bits = self.bits
        if self.keep is None:
            tensor.copy_(bits)
        elif bits is self.bits and self.clear:
            int_view(tensor).mul_(self.keep)  # the kept bits are all 0
        else:
            view = int_view(tensor)
            torch.addcmul(bits, view, self.keep, out=view)
        self.version = internals.torch_trainer.tensor_version(tensor)


class _Held:
    """A held variable: its own kept bits, its slots', its EMA average's."""

    __slots__ = ("variable", "slots", "average")

    def __init__(self, variable, keep, slots, average, fill=None, filled=(), stay=()):
        self.variable = _Kept(variable, keep)
        self.slots = [
            _Kept(slot, keep, fill if id(slot) in filled else None, id(slot) in stay)
            for slot in slots
        ]
        self.average = None if average is None else _Kept(average, keep)


class Guard:
    """Holds the frozen entries of one optimizer's masked variables across `apply`.

    Built per plan: the masks in force (`selected`, one per masked position),
    the positions without a gradient (held whole), and the optimizer's slots.

    Args:
      masks: the `StatelessMasks` of `variables`.
      selected: the mask in force per masked position (bool, or numbers).
      missing: positions whose gradient is None, held whole.
      slots: per variable, `(slots, average)` as `maskfit.step.stateless._slots`.
      variables: the Keras variables, in the masks' order.
      filled: ids of the slots whose frozen entries get 1.0 before the
        update (`sqrt_slots`); a variable held whole fills none.
        Each such variable holds one more integer tensor of its shape (1.0's
        bits where frozen), made once, shared by its filled slots.
      stay: ids of the slots whose +0.0 entries the update leaves +0.0 under
        a +0.0 gradient (`zero_slots`): not restored while their frozen
        entries are all +0.0 (`restore(zeroed=True)`).

    Example:

    >>> import torch
    >>> int_view(torch.tensor([-0.0])).tolist()
    [-2147483648]
    """

    def __init__(self, masks, selected, missing, slots, variables, filled=(), stay=()):
        self.masked = None  # [(gradient, its version)] the last masking returned
        self.frozen = {}  # position: bool tensor of the mask's shape
        self.keeps = {}  # position: its keep (1 where it learns, 0 where frozen)
        held = []
        for position, mask in zip(masks.positions, selected):
            mask = torch.as_tensor(mask)
            frozen = ~mask if mask.dtype == torch.bool else mask == 0
            if position in missing or not bool(frozen.any()):
                continue  # all ones: nothing to hold (missing: held whole below)
            self.frozen[position] = frozen
            value = variables[position].value
            keep = _keep_ones(frozen.to(value.device), value.dtype)
            self.keeps[position] = keep
            held.append((position, keep))
        held.extend((position, None) for position in sorted(missing))
        self.held = []
        for position, keep in held:
            own, average = slots[position]
            fill = None
            if keep is not None and any(id(s) in filled for s, _ in own):
                fill = _one_bits(variables[position].value.dtype, keep)
            self.held.append(
                _Held(
                    variables[position],
                    keep,
                    [s for s, _ in own],
                    average,
                    fill,
                    filled if fill is not None else (),
                    stay,
                )
            )

    def take(self):
        """Before the update: the frozen bits, read again only where written since.

        Then 1.0 goes into the frozen entries of the slots to fill.
        """
        for held in self.held:
            held.variable.take()
            for slot in held.slots:
                slot.take()
                slot.fill_frozen()

    def restore(self, zeroed=False):
        """After the update: the frozen entries put back, bit for bit, in place.

        `zeroed`: the gradients were masked by `mask_gradients` (every frozen
        entry +0.0), so slots that hold +0.0 there need nothing put back.
        """
        for held in self.held:
            held.variable.restore()
            for slot in held.slots:
                slot.restore(zeroed=zeroed)
            if held.average is not None:
                held.average.restore(held.variable.bits)
                held.average.version = -1  # its bits are the variable's

    def mask_gradients(self, gradients, masks, selected, variables):
        """`gradients`, 0 at frozen entries (NaN and Inf too); in place on `.grad`.

        A gradient that is its variable's `.grad` (Keras's torch step) is
        masked in place; any other is left as passed and a masked copy
        returned. Values of a `scale="gradient"` mask other than 0 and 1
        scale the gradient.
        """
        gradients = list(gradients)
        self.masked = []
        for position, mask, scale in zip(masks.positions, selected, masks.scales):
            gradient = gradients[position]
            if gradient is None:
                continue
            mask = torch.as_tensor(mask)
            if scale == "gradient" and mask.dtype != torch.bool:
                gradient = gradient * mask.to(gradient.dtype)
            frozen = self.frozen.get(position)
            if frozen is None:
                gradients[position] = gradient
            elif gradient is variables[position].value.grad:
                # +0.0 where frozen (all bits cleared): one pass, in place.
                int_view(gradient).mul_(self.keeps[position])
            else:
                gradients[position] = gradient.masked_fill(frozen, 0)
            if frozen is not None:
                tensor = gradients[position]
                version = internals.torch_trainer.tensor_version(tensor)
                self.masked.append((position, tensor, version))
        return gradients

    def zeroed(self, gradients):
        """Whether `gradients` are +0.0 at every frozen entry, as `mask_gradients` made them.

        True when each held position's gradient is the tensor the last
        `mask_gradients` returned, not written since. Clears that record.
        """
        masked, self.masked = self.masked, None
        if masked is None or len(masked) != len(self.frozen):
            return False
        return all(
            gradients[position] is tensor
            and internals.torch_trainer.tensor_version(tensor) == version
            for position, tensor, version in masked
        )


def _held(optimizer, masks, selected, gradients, variables):
    """`[(variable, frozen, slots, average)]`: what the update must not move.

    A variable without a gradient is held whole: Keras's weight decay and
    EMA overwrite would move it otherwise.
    """
    frozen = {
        position: keras.ops.logical_not(stateless._keeps(mask))
        for position, mask in zip(masks.positions, selected)
    }
    for position, gradient in enumerate(gradients):
        if gradient is None:
            frozen[position] = keras.ops.convert_to_tensor(True)
    if not frozen:
        return []
    slots = stateless._slots(optimizer, variables)
    held = []
    for position, where in frozen.items():
        own, average = slots[position]
        held.append((variables[position], where, [s for s, _ in own], average))
    return held


def copied(optimizer, masks, selected, gradients, variables):
    """Copies what the update must not move; returns a function that puts it back.

    The guard under `torch.compile`, which traces plain copies and
    `torch.where` (not the version counters `Guard` reads).
    """
    held = _held(optimizer, masks, selected, gradients, variables)
    before = [
        (variable.value.clone(), [slot.value.clone() for slot in slots])
        for variable, _, slots, _ in held
    ]

    def restore():
        for (variable, frozen, slots, average), (value, slot_values) in zip(
            held, before
        ):
            _put_back(variable, frozen, value)
            for slot, slot_value in zip(slots, slot_values):
                _put_back(slot, frozen, slot_value)
            if average is not None:
                _put_back(average, frozen, variable.value)

    return restore


def _put_back(variable, frozen, value):
    """Writes `value` into `variable`'s frozen entries, in place."""
    current = variable.value
    frozen = torch.as_tensor(frozen, device=current.device)
    current.copy_(torch.where(frozen, value.to(current.dtype), current))
