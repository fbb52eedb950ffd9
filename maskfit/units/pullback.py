"""`vjp(call, values)`: a function's outputs and its pullback, on JAX or PyTorch.

The output-unit self-check (`maskfit.units.probe`) pulls cotangents back
through a layer's call to see which entries of its variables each unit
reaches. On TensorFlow it keeps a tape; on JAX and PyTorch it runs this:
`jax.vjp`, or the same made of `torch.autograd.grad`.
"""

import keras
import numpy as np

__all__ = ["vjp"]


def vjp(call, values):
    """`(outputs, pull)`: `call(values)` and a function `cotangents -> (grads,)`.

    Args:
      call: a function of a list of tensors that returns a list of tensors.
      values: the list of tensors to differentiate with respect to.

    Returns:
      The list `call(values)` returns and `pull`, which maps one cotangent
      per output (NumPy arrays or tensors) to a 1-tuple holding one gradient
      per value, as NumPy arrays (zeros where an output does not reach it).

    Example:

    >>> import keras
    >>> if keras.backend.backend() == "tensorflow":  # the probe keeps a tape there
    ...     print([[2.0, 4.0]])
    ... else:
    ...     outputs, pull = vjp(lambda v: [v[0] * v[0]],
    ...                         [keras.ops.convert_to_tensor([1.0, 2.0])])
    ...     print([g.tolist() for g in pull([np.ones(2, "float32")])[0]])
    [[2.0, 4.0]]
    """
    if keras.backend.backend() == "jax":
        import jax

        outputs, pull = jax.vjp(call, values)

        def jax_pull(cotangents):
            (grads,) = pull([keras.ops.convert_to_tensor(c) for c in cotangents])
            return ([np.asarray(g) for g in grads],)

        return outputs, jax_pull
    import torch

    values = [
        v.detach().requires_grad_(True) if v.is_floating_point() else v for v in values
    ]
    with torch.enable_grad():
        outputs = call(values)
    learns = [v for v in values if v.requires_grad]

    def torch_pull(cotangents):
        pairs = [
            (o, torch.as_tensor(np.asarray(c), dtype=o.dtype, device=o.device))
            for o, c in zip(outputs, cotangents)
            if o.requires_grad
        ]
        grads = iter(
            torch.autograd.grad(
                [o for o, _ in pairs],
                learns,
                grad_outputs=[c for _, c in pairs],
                retain_graph=True,
                allow_unused=True,
            )
            if pairs and learns
            else [None] * len(learns)
        )
        found = []
        for v in values:
            grad = next(grads) if v.requires_grad else None
            grad = torch.zeros_like(v) if grad is None else grad
            found.append(grad.detach().cpu().numpy())
        return (found,)

    return outputs, torch_pull
