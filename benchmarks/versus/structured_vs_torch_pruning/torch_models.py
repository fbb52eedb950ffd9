"""The structured-pruning architectures in PyTorch, and their inference latency.

Needs `torch` (the `structured-peer` extra); nothing else imports this
module without it. `torch_model` builds the `Node` list of an
`experiments.common.structured.models` architecture as a `torch.nn.Module` whose
submodules carry the Keras layer names, and loads the same NumPy initial
weights as `structured_models.keras_model`; ReLU and pooling are modules
(`nn.ReLU`, `nn.AdaptiveAvgPool*`), so Torch-Pruning's
`tp.utils.count_ops_and_params` counts them as `experiments.common.model_cost`
does for Keras. `torch_inference` makes a zero-argument callable of a model
for `experiments.common.latency.interleaved`; `set_torch_threads` fixes PyTorch's
thread pools.
"""

import numpy as np
import torch
from torch import nn

from experiments.common.structured import models as structured_models

__all__ = [
    "TORCH_PATHS",
    "set_torch_threads",
    "to_torch_layout",
    "torch_inference",
    "torch_model",
]

# How a PyTorch model can answer a batch at inference, always in eval mode
# under `torch.inference_mode()`:
# - "eager": the module's forward, op by op,
# - "trace": `torch.jit.trace` then `torch.jit.freeze` (TorchScript, batch
#   norm folded into the convolutions),
# - "compile": `torch.compile` (Inductor; needs a C++ compiler, and tens of
#   seconds per model and batch size the first time).
TORCH_PATHS = ("eager", "trace", "compile")


def set_torch_threads(intra_op, inter_op):
    """Sets PyTorch's intra-op and inter-op threads, before any parallel work.

    Raises:
      RuntimeError: if the inter-op pool has already started with another size.
    """
    torch.set_num_threads(intra_op)
    if torch.get_num_interop_threads() != inter_op:
        try:
            torch.set_num_interop_threads(inter_op)
        except RuntimeError as e:
            raise RuntimeError(
                "PyTorch's inter-op pool is already running with"
                f" {torch.get_num_interop_threads()} threads; set it before any"
                f" parallel work. Received: inter_op={inter_op!r}"
            ) from e


class Network(nn.Module):
    """A `structured_models` architecture: the nodes' modules, run in order."""

    def __init__(self, arch):
        super().__init__()
        self.arch = arch
        self.nodes = arch.nodes()
        counts = structured_models.channels(arch)
        dims = getattr(arch, "spatial_dims", 0)
        for node in self.nodes:
            module = _module(node, counts[node.inputs[0]], dims)
            if module is not None:
                self.add_module(node.name, module)

    def forward(self, x):
        outputs = {"input": x}
        for node in self.nodes:
            args = [outputs[name] for name in node.inputs]
            if node.op == "reshape":
                # Channels last (Keras) to channels first (PyTorch).
                shape = self.arch.input_shape
                image = args[0].reshape((-1,) + tuple(shape))
                out = image.movedim(-1, 1)
            elif node.op == "add":
                out = args[0] + args[1]
            else:
                out = getattr(self, node.name)(args[0])
            outputs[node.name] = out
        return outputs["logits"]


def _module(node, in_channels, dims):
    if node.op == "dense":
        linear = nn.Linear(in_channels, node.size)
        return nn.Sequential(linear, nn.ReLU()) if node.relu else linear
    if node.op == "conv":
        conv = {1: nn.Conv1d, 2: nn.Conv2d}[dims]
        return conv(
            in_channels,
            node.size,
            node.kernel,
            stride=node.stride,
            padding=node.kernel // 2,
            bias=False,
        )
    if node.op == "batch_norm":
        norm = {1: nn.BatchNorm1d, 2: nn.BatchNorm2d}[dims]
        return norm(
            in_channels,
            eps=structured_models.BN_EPSILON,
            momentum=structured_models.BN_MOMENTUM,
        )
    if node.op == "relu":
        return nn.ReLU()
    if node.op == "global_pool":
        return nn.Sequential(
            {1: nn.AdaptiveAvgPool1d, 2: nn.AdaptiveAvgPool2d}[dims](1), nn.Flatten()
        )
    return None  # reshape and add are done in `forward`.


def to_torch_layout(op, arrays):
    """Keras's weights of one layer (`op`) as PyTorch's, in PyTorch's order."""
    if op == "dense":
        kernel, bias = arrays
        return [kernel.T, bias]
    if op == "conv":
        (kernel,) = arrays
        # (spatial..., in, out) -> (out, in, spatial...)
        return [np.moveaxis(kernel, (-1, -2), (0, 1))]
    return list(arrays)  # batch norm: scale, offset, mean, variance.


def _load(module, op, arrays):
    if isinstance(module, nn.Sequential):
        module = module[0]
    values = [
        torch.from_numpy(np.ascontiguousarray(a)) for a in to_torch_layout(op, arrays)
    ]
    if op == "batch_norm":
        targets = [module.weight, module.bias, module.running_mean, module.running_var]
    else:
        targets = [module.weight] + ([module.bias] if op == "dense" else [])
    for target, value in zip(targets, values):
        if tuple(target.shape) != tuple(value.shape):
            raise ValueError(
                f"Layer {module!r} expects a weight of shape {tuple(target.shape)};"
                f" received {tuple(value.shape)}."
            )
        with torch.no_grad():
            target.copy_(value)


def torch_model(arch, seed=None):
    """Builds `arch` as a `torch.nn.Module` with `structured_models.initial_weights`.

    Args:
      arch: a `structured_models.MLP` or `ResNet`.
      seed: the initial weights' seed (as `structured_models.keras_model`);
        None keeps PyTorch's own initialisation.

    Returns:
      A module taking `(batch, arch.features)` float32 inputs and returning
      logits, with a submodule per weighted layer, named as in Keras (a
      Dense with ReLU is `nn.Sequential(nn.Linear, nn.ReLU)`).

    Example:

    >>> from experiments.common.structured.models import MLP
    >>> net = torch_model(MLP(64, hidden=(8,)), seed=0)
    >>> net(torch.zeros(2, 64)).shape
    torch.Size([2, 10])
    """
    model = Network(arch)
    if seed is not None:
        ops = {node.name: node.op for node in arch.nodes()}
        for name, arrays in structured_models.initial_weights(arch, seed).items():
            _load(getattr(model, name), ops[name], arrays)
    return model


def torch_inference(model, batch, path="eager", seed=0):
    """Returns a callable that runs `model` (in eval mode) on one fixed batch.

    The batch is drawn once (standard normal, `seed`) in the model's input
    shape; the callable has been called once, so tracing and compiling are
    done. The model is put in eval mode; "trace" and "compile" work on a
    copy of its graph, so later changes to the model do not reach them.

    Raises:
      ValueError: for an unknown path.
    """
    if path not in TORCH_PATHS:
        raise ValueError(
            f"Received an unknown inference path, expected one of {TORCH_PATHS}."
            f" Received: path={path!r}"
        )
    model.eval()
    features = model.arch.features
    x = np.random.default_rng(seed).standard_normal((batch, features))
    x = torch.from_numpy(x.astype(np.float32))
    with torch.no_grad():
        if path == "trace":
            function = torch.jit.freeze(torch.jit.trace(model, x))
        elif path == "compile":
            function = torch.compile(model)
        else:
            function = model
        function(x)

    def call():
        with torch.inference_mode():
            return function(x)

    call()
    return call
