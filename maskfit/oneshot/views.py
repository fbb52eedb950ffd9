"""A Dense or EinsumDense kernel as the 2-D `(in, out)` matrix its layer multiplies by.

One-shot pruning works on `y = x @ W`, `W` of shape `(in, out)`: Wanda's
input norms and SparseGPT's Hessian `X^T X` are over the `in` axis. A Dense
kernel is that matrix already. An EinsumDense kernel (keras_hub's attention
projections: query `(hidden, heads, head_dim)` with `"btd,dnh->btnh"`, output
`(heads, head_dim, hidden)` with `"btnh,nhd->btd"`) becomes one: its axes
that the input contracts, in kernel order, flattened into `in`; its axes
that reach the output, in kernel order, into `out`. The layer's input is
flattened the same way, its other axes into rows (tokens), so the matrix
product of the two is the layer's output up to a reshape.
"""

import dataclasses

import keras
import numpy as np

__all__ = ["KernelView", "kernel_view"]


@dataclasses.dataclass(frozen=True)
class KernelView:
    """How a layer's kernel and input map onto `x @ W` with `W` of shape `(in, out)`.

    Attributes:
      variable: the kernel variable.
      shape: the kernel's shape.
      order: the kernel's axes, contracted ones first (a permutation).
      rows: the 2-D matrix's shape `(in, out)`.
      input_letters: an EinsumDense's input subscripts ("" for Dense).
      contracted: the subscripts the input contracts, in kernel order.
    """

    variable: object
    shape: tuple
    order: tuple
    rows: tuple
    input_letters: str = ""
    contracted: str = ""

    def matrix(self, value):
        """The kernel value as the `(in, out)` matrix (float64)."""
        value = np.asarray(value, np.float64)
        return np.transpose(value, self.order).reshape(self.rows)

    def kernel(self, matrix):
        """The `(in, out)` matrix back in the kernel's shape."""
        permuted = [self.shape[axis] for axis in self.order]
        return np.transpose(matrix.reshape(permuted), np.argsort(self.order))

    def inputs(self, x):
        """The layer's input `x` as `(tokens, in)` (float64)."""
        x = np.asarray(x, np.float64)
        if not self.input_letters:
            return x.reshape(-1, self.rows[0])
        letters = self.input_letters
        if "..." in letters:
            extra = x.ndim - (len(letters) - 3)
            letters = letters.replace(
                "...", "".join(chr(0x100 + i) for i in range(extra))
            )
        kept = [i for i, c in enumerate(letters) if c not in self.contracted]
        moved = [letters.index(c) for c in self.contracted]
        return np.transpose(x, kept + moved).reshape(-1, self.rows[0])


def _dense_view(variable):
    shape = tuple(variable.shape)
    return KernelView(variable, shape, (0, 1), shape)


def _einsum_view(layer, variable):
    """The view of an EinsumDense kernel, or a string saying why there is none."""
    equation = layer.equation.replace(" ", "")
    try:
        left, output = equation.split("->")
        source, kernel = left.split(",")
    except ValueError:
        return f"its equation {equation!r} is not 'input,kernel->output'"
    if "..." in kernel:
        return f"its kernel takes an ellipsis in {equation!r}"
    inner = source.replace("...", "")
    contracted = [c for c in kernel if c in inner and c not in output]
    produced = [c for c in kernel if c in output and c not in inner]
    shared = [c for c in kernel if c not in contracted and c not in produced]
    if shared:
        return (
            f"kernel axes {shared} of {equation!r} are not a plain input-to-output"
            " map (an axis both input and output keep, or neither)"
        )
    summed = [c for c in inner if c not in kernel and c not in output]
    if summed or not contracted or not produced:
        return f"{equation!r} is not a matrix product of the input with the kernel"
    shape = tuple(variable.shape)
    order = tuple(kernel.index(c) for c in contracted + produced)
    size = [
        int(np.prod([shape[kernel.index(c)] for c in part]))
        for part in (contracted, produced)
    ]
    return KernelView(variable, shape, order, tuple(size), source, "".join(contracted))


def kernel_view(layer):
    """The `KernelView` of a Dense or EinsumDense layer, or a string: why it is refused."""
    if getattr(layer, "lora_enabled", False):
        return (
            "LoRA is enabled on it: prune first, then call enable_lora (its"
            " kernel is then frozen and keeps its zeros)"
        )
    mode = getattr(layer.dtype_policy, "quantization_mode", None)
    if mode is not None:
        return f"it is quantized ({mode}): prune the float model, then quantize"
    kernels = [w for w in layer.weights if w.name == "kernel"]
    if len(kernels) != 1:
        return f"it has {len(kernels)} variables named 'kernel', expected one"
    variable = kernels[0]
    if not variable.trainable:
        return "its kernel is not trainable, so no mask could keep its zeros"
    if isinstance(layer, keras.layers.EinsumDense):
        return _einsum_view(layer, variable)
    if len(variable.shape) != 2:
        return f"its kernel has shape {tuple(variable.shape)}, expected (in, out)"
    return _dense_view(variable)
