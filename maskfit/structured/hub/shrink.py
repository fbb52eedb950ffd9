"""`shrink(..., uniform=True)` of a keras_hub backbone: the same class, a smaller config.

When every block keeps as many heads and FFN units as the others (what a
per-layer fraction gives: LLM width pruning), the shrunk backbone is the
backbone's own keras_hub class with `intermediate_dim` (`mlp_dim`),
`num_heads` / `num_query_heads` / `num_key_value_heads` (and `head_dim`,
where the class has it) written in its config: `from_config` rebuilds it,
and it saves and loads with Keras and keras_hub only.
"""

import inspect

import keras

from maskfit import internals
from maskfit.kinds.couplings.lookup import coupling_of
from maskfit.structured.hub import couplings as couplings_hub
from maskfit.structured.hub import twins as hub_twins

__all__ = ["block_config", "config_of", "refusal", "same_class"]


def config_of(layer):
    """`layer.get_config()` as `from_config` takes it, for keras_hub's layers too.

    Where keras_hub's `get_config` raises (0.32's `LlamaTransformerDecoder`
    reads an attribute it never sets), the config is read from the layer's
    `__init__` arguments; keys its `__init__` does not take (0.32's
    `ViTPatchingAndEmbedding` writes `num_patches`) are left out. An
    `__init__` argument its `get_config` leaves out (0.32's
    `Qwen3TransformerDecoder` drops `head_dim`) is read from the attribute
    of that name, so no field is lost; one that no attribute holds in a form
    a config can write stays out (and `from_config` says so).
    """
    if couplings_hub.hub_class_name(layer) is None:
        return layer.get_config()
    parameters = inspect.signature(type(layer).__init__).parameters
    try:
        config = layer.get_config()
    except AttributeError:
        config = keras.layers.Layer.get_config(layer)
    for name in parameters:
        if name in ("self", "args", "kwargs") or name in config:
            continue
        if hasattr(layer, name):
            value = _plain(getattr(layer, name))
            if value is not _UNWRITABLE:
                config[name] = value
    base = keras.layers.Layer.get_config(layer)
    return {k: v for k, v in config.items() if k in parameters or k in base}


_UNWRITABLE = object()


def _plain(value):
    """`value` as a config writes it, or `_UNWRITABLE`."""
    if isinstance(value, keras.initializers.Initializer):
        return keras.initializers.serialize(value)
    if isinstance(value, (keras.layers.Layer, type)):
        return _UNWRITABLE  # a sublayer or a class: not a config value
    if callable(value):
        try:
            return keras.activations.serialize(value)
        except Exception:  # noqa: BLE001 - not an activation
            return _UNWRITABLE
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple)):
        items = [_plain(v) for v in value]
        return _UNWRITABLE if _UNWRITABLE in items else type(value)(items)
    if isinstance(value, dict):
        items = {k: _plain(v) for k, v in value.items()}
        return _UNWRITABLE if _UNWRITABLE in items.values() else items
    return _UNWRITABLE


def block_config(model, shrunk):
    """`{config key: value}` that every hub block of `model` keeps, or raises.

    Raises:
      ValueError: naming the blocks, when they keep different counts or the
        model has none.
    """
    found, head_sizes = {}, set()
    for layer in internals.sublayers(model):
        coupling = coupling_of(layer)
        if isinstance(coupling, couplings_hub.HubBlock):
            _check_heads(model, layer, coupling, shrunk)
            for counts in coupling.counts(layer, shrunk):
                found.setdefault(tuple(sorted(counts.items())), []).append(layer.name)
            head_sizes.add(couplings_hub.head_size(layer, coupling.spec))
    if len(found) != 1 or len(head_sizes) > 1:
        raise ValueError(
            f"shrink(uniform=True) keeps the class of '{model.name}'"
            f" ({type(model).__name__}) only when every transformer block keeps as"
            " many heads and FFN units as the others. Received: "
            + (
                "; ".join(f"{dict(k)} in {v}" for k, v in found.items())
                + ". Prune with a per-layer fraction (global_pruning=False), or"
                " shrink with uniform=False for a functional model."
                if found
                else "no keras_hub transformer block, so its config says nothing"
                " maskfit can shrink (a ResNetBackbone's widths are per stack)."
                " Shrink with uniform=False for a functional model."
            )
        )
    config = dict(next(iter(found)))
    if len(head_sizes) == 1:
        config["head_dim"] = head_sizes.pop()
    return config


def _check_heads(model, layer, coupling, shrunk):
    spec = coupling.spec
    name = type(layer).__name__
    if spec.head_dim_key is not None or name in hub_twins.TWINS:
        return
    key = spec.attention.query_key
    if any(
        c.get(key, getattr(layer, key)) != getattr(layer, key)
        for c in coupling.counts(layer, shrunk)
    ):
        raise ValueError(
            f"shrink(uniform=True): {type(model).__name__}'s blocks ({name})"
            " derive their head size from hidden_dim // num_heads, so"
            f" '{layer.name}' with fewer heads cannot be written in"
            f" {type(model).__name__}'s config. Shrink with uniform=False: a"
            " functional model of stock Keras layers."
        )


def same_class(origin, shrunk):
    """`origin`'s class rebuilt from its config with the kept counts; weights cut.

    A keras_hub task model (`LlamaCausalLM`) gets its backbone shrunk so and
    is built anew around it, with its preprocessor (the task class of the
    backbone's twin, where the backbone became its twin).

    Args:
      origin: the keras_hub backbone or task (the model pruned, or the model
        a `MaskedModel` was made from: it holds the same variables).
      shrunk: the `_Shrunk` of the selection.
    """
    if couplings_hub.hub_class_name(origin) is None:
        raise ValueError(
            f"shrink(uniform=True) rebuilds a keras_hub model's own class, and"
            f" '{origin.name}' is a {type(origin).__name__}, made from no keras_hub"
            " model in this process (prune_units remembers the one it was given;"
            " a pruned model loaded from a file does not). Shrink with"
            " uniform=False for a functional model."
        )
    backbone = getattr(origin, "backbone", None)
    if isinstance(backbone, keras.Model):
        small = _backbone(backbone, shrunk)
        cls = type(origin)
        if type(small) is not type(backbone):
            cls = hub_twins.twin_class(cls.__name__)
        return cls(backbone=small, preprocessor=origin.preprocessor)
    return _backbone(origin, shrunk)


def _backbone(origin, shrunk):
    try:
        config = origin.get_config()
    except Exception as error:  # noqa: BLE001 - a config it cannot write
        raise refusal(origin, "get_config()", error, uniform=True) from error
    counts = block_config(origin, shrunk)
    head_dim = counts.pop("head_dim", None)
    name, cls = type(origin).__name__, type(origin)
    heads_changed = any(config.get(k) != v for k, v in counts.items() if "heads" in k)
    config.update(counts)
    if "head_dim" in config:
        config["head_dim"] = head_dim
    elif heads_changed and name in hub_twins.TWINS:
        if getattr(origin, "tie_word_embeddings", False):
            raise ValueError(
                f"shrink(uniform=True): '{origin.name}' ({name}) ties its input and"
                " output embeddings, which its twin class"
                f" {hub_twins.TWINS[name][1]} (a Llama with a head size of its own)"
                " cannot. Keep its heads, or shrink with uniform=False."
            )
        cls = hub_twins.twin_class(name)
        config = hub_twins.twin_config(name, config, head_dim)
    try:
        small = cls.from_config(config)
    except Exception as error:  # noqa: BLE001 - a config it cannot read back
        raise refusal(origin, f"{cls.__name__}.from_config()", error, True) from error
    shrunk.copy(
        origin.weights,
        small.weights,
        f"shrink(uniform=True): {type(origin).__name__}",
        "its class cannot be kept with this selection. Shrink with uniform=False.",
    )
    return small


def refusal(layer, operation, error, uniform=False):
    """The one error of a layer `shrink` cannot rebuild: the layer, the operation, why.

    A ValueError of maskfit's own that names the layer already is returned
    as it is.

    Example:

    >>> import keras
    >>> error = refusal(keras.layers.Dense(2, name="d"), "from_config()",
    ...                 TypeError("missing 1 required positional argument: 'units'"))
    >>> print(str(error).split(";")[0])
    shrink: layer 'd' (Dense) cannot be rebuilt with fewer units: its from_config() raised TypeError: missing 1 required positional argument: 'units'
    """
    if isinstance(error, ValueError) and f"'{layer.name}'" in str(error):
        return error
    text = " ".join(str(error).split())
    if "Exception encountered:" in text:  # Keras's deserializer: the config, then why
        text = text.rsplit("Exception encountered:", 1)[1].strip()
    text = text[:400]
    what = f"shrink(uniform=True): '{layer.name}'" if uniform else "shrink: layer"
    if not uniform:
        what += f" '{layer.name}'"
    advice = (
        "Shrink with uniform=False: a functional model with each layer rebuilt."
        if uniform
        else "shrink rebuilds every layer from its config, and this class's"
        " get_config() does not give back what its __init__ takes: fix or"
        " override its get_config() (for a keras_hub class, a keras_hub bug), or"
        " keep the model unshrunk (its masks already hold the pruned units at 0)."
    )
    return ValueError(
        f"{what} ({type(layer).__name__}) cannot be rebuilt with fewer units: its"
        f" {operation} raised {type(error).__name__}: {text}; {advice}"
    )
