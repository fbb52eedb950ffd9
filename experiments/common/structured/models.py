"""The structured-pruning networks, as one layer list that Keras and PyTorch both build.

`MLP` and `ResNet` describe a network; `nodes()` lists its layers as `Node`s
(name, operation, inputs, size), and every builder walks that one list:
`keras_model` here, `benchmarks.torch_models.torch_model` for PyTorch. So
the two frameworks get the same layers, in the same order, under the same
names, and `initial_weights` draws one set of initial weights (in NumPy, from
a seed) that both load: the same initial values, not just the same
distribution.

- `MLP(features, hidden=(1024, 1024))`: Dense+ReLU layers `dense_1`,
  `dense_2`, ..., then `logits` (no activation).
- `ResNet(input_shape, widths=(32, 64, 128), blocks=1)`: a CIFAR-style
  residual network (He et al., 2016, option B shortcuts) in 1-D or 2-D: a
  3-wide stem convolution + batch norm + ReLU, then one stage per width of
  `blocks` basic blocks (conv-BN-ReLU-conv-BN, plus the shortcut, then ReLU),
  the first block of every stage but the first with stride 2 and a 1-wide
  convolution + batch norm on the shortcut; global average pooling and
  `logits`. `blocks=1` is ResNet-8, `blocks=3` ResNet-20. Convolutions have
  no bias (batch norm follows). Batch norm uses PyTorch's defaults
  (momentum 0.1 of the new statistic, epsilon 1e-5) in both frameworks.

Both take the flat features of `experiments.common.datasets` and reshape them first
(`input_shape`, channels last in Keras: digits as 8x8x1 images, MNIST-1D as
40x1 sequences). One difference between the frameworks is left: a stride-2
3-wide convolution pads the way each framework does (Keras "same" pads one
zero at the end of an even-length axis, PyTorch `padding=1` one at each
end), so the strided grid is offset by one position; shapes, parameters and
MACs are the same.
"""

import dataclasses

import keras
import numpy as np

__all__ = [
    "MLP",
    "Node",
    "INPUT_SHAPES",
    "ResNet",
    "channels",
    "for_data",
    "initial_weights",
    "keras_model",
    "set_initial_weights",
]

# Batch norm as PyTorch's defaults, in both frameworks (Keras's momentum is
# the weight of the old statistic).
BN_EPSILON = 1e-5
BN_MOMENTUM = 0.1


@dataclasses.dataclass(frozen=True)
class Node:
    """One layer: `op` applied to the outputs of `inputs` ("input": the model's).

    Attributes:
      name: the layer's name, in Keras and (as the attribute) in PyTorch.
      op: one of "reshape", "dense", "conv", "batch_norm", "relu", "add",
        "global_pool".
      inputs: names of the nodes it reads.
      size: units of a "dense", filters of a "conv"; 0 otherwise.
      kernel: a "conv"'s kernel size along each spatial axis.
      stride: a "conv"'s stride.
      relu: a "dense" applies ReLU to its output.
    """

    name: str
    op: str
    inputs: tuple
    size: int = 0
    kernel: int = 1
    stride: int = 1
    relu: bool = False


def _positive_ints(name, values):
    if (
        not isinstance(values, tuple)
        or not values
        or any(isinstance(v, bool) or not isinstance(v, int) or v < 1 for v in values)
    ):
        raise ValueError(
            f"Received an invalid value for `{name}`, expected a non-empty tuple of"
            f" positive integers. Received: {name}={values!r}"
        )


@dataclasses.dataclass(frozen=True)
class MLP:
    """A ReLU multilayer perceptron: `features` -> `hidden`... -> `classes` logits.

    Example:

    >>> [n.name for n in MLP(64, hidden=(8, 8)).nodes()]
    ['dense_1', 'dense_2', 'logits']
    """

    features: int
    hidden: tuple = (1024, 1024)
    classes: int = 10

    def __post_init__(self):
        _positive_ints("hidden", self.hidden)
        _positive_ints("features and classes", (self.features, self.classes))

    @property
    def input_shape(self):
        return (self.features,)

    def nodes(self):
        """The layers, in order."""
        nodes, previous = [], "input"
        for i, units in enumerate(self.hidden, start=1):
            nodes.append(
                Node(f"dense_{i}", "dense", (previous,), size=units, relu=True)
            )
            previous = nodes[-1].name
        nodes.append(Node("logits", "dense", (previous,), size=self.classes))
        return tuple(nodes)


@dataclasses.dataclass(frozen=True)
class ResNet:
    """A CIFAR-style ResNet in 1-D (`input_shape=(length, channels)`) or 2-D.

    Example:

    >>> net = ResNet((8, 8, 1), widths=(8, 16), blocks=1)
    >>> net.features, len([n for n in net.nodes() if n.op == "conv"])
    (64, 6)
    """

    input_shape: tuple
    widths: tuple = (32, 64, 128)
    blocks: int = 1
    classes: int = 10
    # The first convolution's filters of each block, in order (stages x
    # blocks); None: each stage's width. A pruned network has its own.
    inner_widths: tuple = None

    def __post_init__(self):
        _positive_ints("widths", self.widths)
        if self.inner_widths is not None:
            _positive_ints("inner_widths", self.inner_widths)
            if len(self.inner_widths) != len(self.widths) * self.blocks:
                raise ValueError(
                    "Received an invalid value for `inner_widths`, expected one"
                    f" width per block ({len(self.widths)} stages x {self.blocks}"
                    f" blocks). Received: inner_widths={self.inner_widths!r}"
                )
        _positive_ints("input_shape", self.input_shape)
        _positive_ints("blocks and classes", (self.blocks, self.classes))
        if len(self.input_shape) not in (2, 3):
            raise ValueError(
                "Received an invalid value for `input_shape`, expected (length,"
                " channels) or (height, width, channels). Received:"
                f" input_shape={self.input_shape!r}"
            )

    @property
    def features(self):
        return int(np.prod(self.input_shape))

    @property
    def spatial_dims(self):
        return len(self.input_shape) - 1

    def nodes(self):
        """The layers, in order; a stage's blocks are `stage{s}_block{b}_*`."""
        nodes = [Node("reshape", "reshape", ("input",))]

        def conv_bn(prefix, source, size, kernel, stride):
            nodes.append(Node(f"{prefix}conv", "conv", (source,), size, kernel, stride))
            nodes.append(Node(f"{prefix}bn", "batch_norm", (f"{prefix}conv",)))
            return f"{prefix}bn"

        out = conv_bn("stem_", "reshape", self.widths[0], 3, 1)
        nodes.append(Node("stem_relu", "relu", (out,)))
        previous, width = "stem_relu", self.widths[0]
        inner = iter(self.inner_widths or np.repeat(self.widths, self.blocks))
        for s, size in enumerate(self.widths, start=1):
            for b in range(1, self.blocks + 1):
                prefix = f"stage{s}_block{b}_"
                stride = 2 if s > 1 and b == 1 else 1
                out = conv_bn(prefix + "1_", previous, int(next(inner)), 3, stride)
                nodes.append(Node(prefix + "1_relu", "relu", (out,)))
                out = conv_bn(prefix + "2_", prefix + "1_relu", size, 3, 1)
                shortcut = previous
                if stride != 1 or size != width:
                    shortcut = conv_bn(prefix + "shortcut_", previous, size, 1, stride)
                nodes.append(Node(prefix + "add", "add", (out, shortcut)))
                nodes.append(Node(prefix + "relu", "relu", (prefix + "add",)))
                previous, width = prefix + "relu", size
        nodes.append(Node("pool", "global_pool", (previous,)))
        nodes.append(Node("logits", "dense", ("pool",), size=self.classes))
        return tuple(nodes)


# How the ResNet sees each data set of `experiments.common.datasets` (channels last).
INPUT_SHAPES = {"digits": (8, 8, 1), "mnist1d": (40, 1)}
_CLASSES = 10  # Both data sets have 10 classes.


def for_data(kind, dataset, **kwargs):
    """The `kind` ("mlp" or "resnet") architecture for the data set named `dataset`.

    The ResNet sees digits as 8x8x1 images and MNIST-1D as 40x1 sequences
    (`INPUT_SHAPES`); `kwargs` go to the architecture (`hidden`, `widths`,
    `blocks`).

    Raises:
      ValueError: for an unknown kind or data set.

    Example:

    >>> for_data("mlp", "mnist1d", hidden=(512, 512))
    MLP(features=40, hidden=(512, 512), classes=10)
    """
    if dataset not in INPUT_SHAPES:
        raise ValueError(
            f"Received an unknown data set, expected one of {sorted(INPUT_SHAPES)}."
            f" Received: dataset={dataset!r}"
        )
    shape = INPUT_SHAPES[dataset]
    if kind == "mlp":
        return MLP(int(np.prod(shape)), classes=_CLASSES, **kwargs)
    if kind == "resnet":
        return ResNet(shape, classes=_CLASSES, **kwargs)
    raise ValueError(
        "Received an unknown architecture, expected 'mlp' or 'resnet'."
        f" Received: kind={kind!r}"
    )


def channels(arch):
    """Maps each node's name (and "input") to its output's channels (units)."""
    counts = {"input": arch.input_shape[-1]}
    for node in arch.nodes():
        if node.op in ("dense", "conv"):
            counts[node.name] = node.size
        else:
            counts[node.name] = counts[node.inputs[0]]
    return counts


def initial_weights(arch, seed):
    """Draws initial weights for `arch`: `{layer name: [arrays]}`, Keras's layout.

    Kernels are Glorot-uniform (Keras's default; a convolution's fans are
    its kernel size times its input or output channels), biases 0, batch
    norm's scale 1, offset 0, moving mean 0 and moving variance 1. The
    arrays are in the order of Keras's `layer.get_weights()`; PyTorch
    transposes them (`benchmarks.torch_models`).
    """
    rng = np.random.default_rng([seed, 23])
    counts = channels(arch)
    weights = {}
    for node in arch.nodes():
        fan_in_channels = counts[node.inputs[0]]
        if node.op in ("dense", "conv"):
            window = (node.kernel,) * _spatial_dims(arch, node)
            shape = window + (fan_in_channels, node.size)
            receptive = int(np.prod(window))
            limit = np.sqrt(6.0 / (receptive * (fan_in_channels + node.size)))
            kernel = rng.uniform(-limit, limit, shape).astype(np.float32)
            weights[node.name] = [kernel]
            if node.op == "dense":
                weights[node.name].append(np.zeros(node.size, np.float32))
        elif node.op == "batch_norm":
            size = fan_in_channels
            weights[node.name] = [
                np.ones(size, np.float32),
                np.zeros(size, np.float32),
                np.zeros(size, np.float32),
                np.ones(size, np.float32),
            ]
    return weights


def _spatial_dims(arch, node):
    """The kernel's spatial rank of `node`: 0 for a dense layer."""
    return arch.spatial_dims if node.op == "conv" else 0


def _keras_layer(arch, node):
    if node.op == "reshape":
        return keras.layers.Reshape(arch.input_shape, name=node.name)
    if node.op == "dense":
        return keras.layers.Dense(
            node.size, activation="relu" if node.relu else None, name=node.name
        )
    if node.op == "conv":
        conv = {1: keras.layers.Conv1D, 2: keras.layers.Conv2D}[arch.spatial_dims]
        return conv(
            node.size,
            node.kernel,
            strides=node.stride,
            padding="same",
            use_bias=False,
            name=node.name,
        )
    if node.op == "batch_norm":
        return keras.layers.BatchNormalization(
            momentum=1.0 - BN_MOMENTUM, epsilon=BN_EPSILON, name=node.name
        )
    if node.op == "relu":
        return keras.layers.ReLU(name=node.name)
    if node.op == "add":
        return keras.layers.Add(name=node.name)
    pool = {
        1: keras.layers.GlobalAveragePooling1D,
        2: keras.layers.GlobalAveragePooling2D,
    }
    return pool[arch.spatial_dims](name=node.name)


def keras_model(arch, seed=None, model_class=None):
    """Builds `arch` as a functional Keras model named after it.

    Args:
      arch: an `MLP` or a `ResNet`.
      seed: draw the initial weights with `initial_weights(arch, seed)`;
        None keeps Keras's own initialisation.
      model_class: the functional model class (`keras.Model` by default;
        `maskfit.MaskedModel` to train with masks).

    Returns:
      The model, taking `(batch, arch.features)` float inputs and returning
      `(batch, classes)` logits; its layers carry the `Node` names.

    Example:

    >>> model = keras_model(MLP(64, hidden=(8,)), seed=0)
    >>> [layer.name for layer in model.layers]
    ['input', 'dense_1', 'logits']
    """
    model_class = model_class or keras.Model
    inputs = keras.Input((arch.features,), name="input")
    outputs = {"input": inputs}
    for node in arch.nodes():
        layer = _keras_layer(arch, node)
        args = [outputs[name] for name in node.inputs]
        outputs[node.name] = layer(args if node.op == "add" else args[0])
    kind = "mlp" if isinstance(arch, MLP) else "resnet"
    model = model_class(inputs, outputs["logits"], name=kind)
    if seed is not None:
        set_initial_weights(model, arch, seed)
    return model


def set_initial_weights(model, arch, seed):
    """Loads `initial_weights(arch, seed)` into the layers of `model` of those names."""
    for name, arrays in initial_weights(arch, seed).items():
        model.get_layer(name).set_weights(arrays)
