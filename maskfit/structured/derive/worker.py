"""Deriving a coupling under TensorFlow: the layer rebuilt in a JAX worker process.

The derivation reads a jaxpr, which only the JAX backend makes. Under
TensorFlow, a Python process run with `KERAS_BACKEND=jax` is started once
(on the first layer to derive; about 10 s) and kept: for each layer, it
imports the layer's class, rebuilds it from its config (a keras_hub
layer's as `shrink` reads it: `hub.shrink.config_of`), builds it at the
input shape, checks that its weights have the original's paths (after the
layer's name) and shapes, and derives it (`coupling.derive`), calling it
with the model's other arguments as zeros; the unit spaces come back by
weight index. What it finds is then held to the gradient check under
TensorFlow, on the real layer, like any coupling.

Three things blocks do are met on the way: a config with a key its
`__init__` calls unrecognized is rebuilt without that key (one that lacks
a required argument, with the layer's attribute of that name); a shape
with unknown dimensions is built at a concrete one (batch aside); weights
made in `call`, not `build`, are made by one call on zeros. The weight
check, then the gradient check on the real layer, hold what comes out.

A layer whose class is not importable by module and name (defined in
`__main__` or inside a function), whose config does not rebuild the same
weights, or a process without JAX, is refused with that reason.
"""

import atexit
import importlib
import inspect
import json
import os
import re
import selectors
import subprocess
import sys
import tempfile

import numpy as np

from maskfit.kinds.couplings import arguments
from maskfit.structured.derive import spaces as derive_spaces
from maskfit.structured.hub import shrink as hub_shrink

__all__ = ["derive_in_worker"]

_TIMEOUT_S = 600
_MARK = "MASKFIT-DERIVED"

_WORKER = """
import json, sys
from maskfit.structured.derive import coupling, worker
for line in sys.stdin:
    try:
        out = {"found": worker.derive_here(json.loads(line), coupling.derive)}
    except Exception as error:
        out = {"error": f"{type(error).__name__}: {error}"}
    print("MASKFIT-DERIVED" + json.dumps(out), flush=True)
"""

# What Keras says of a config key `__init__` refuses, and of one it lacks.
_UNRECOGNIZED = re.compile(
    r"Unrecognized keyword arguments passed to \w+: (\{.*\})", re.S
)
_MISSING = re.compile(
    r"missing \d+ required (?:positional |keyword-only )?arguments?: (.*)"
)


def _rebuilt(cls, config, stored):
    """`cls.from_config(config)`, dropping the keys `__init__` calls unrecognized
    and adding required arguments the config lacks from `stored` (the
    layer's attributes of those names); the weight check guards the result."""
    for _ in range(4):
        try:
            return cls.from_config(config)
        except Exception as error:  # noqa: BLE001 - only two patterns are retried
            text = str(error)
            unknown, missing = _UNRECOGNIZED.search(text), _MISSING.search(text)
            accepted = inspect.signature(cls.__init__).parameters
            dropped = unknown and [
                k for k in config if k not in accepted and f"'{k}': " in unknown[1]
            ]
            added = missing and re.findall(r"'(\w+)'", missing[1])
            if dropped:
                config = {k: v for k, v in config.items() if k not in dropped}
            elif added and all(name in stored for name in added):
                config = {**config, **{name: stored[name] for name in added}}
            else:
                raise
    return cls.from_config(config)


def derive_here(payload, derive):
    """The worker's side: rebuild the layer, build it, check its weights, `derive`."""
    cls = importlib.import_module(payload["module"])
    for part in payload["qualname"].split("."):
        cls = getattr(cls, part)
    layer = _rebuilt(cls, payload["config"], payload["stored"])
    shape = tuple(payload["shape"])
    described = payload["arguments"]
    try:
        # At a concrete shape: a weight sized by an unknown dimension cannot
        # be made (the weight check below refuses one that differs).
        layer.build(shape[:1] + arguments.concrete(shape)[1:])
    except Exception:  # noqa: BLE001 - a build of other shapes: the call builds it
        pass
    if not layer.built or len(layer.weights) < len(payload["weights"]):
        # Weights made in `call`, not `build` (or a `build` that takes the
        # shapes of all its inputs): one call on zeros makes them, as the
        # model's first call did.
        arguments.call(layer, described, np.zeros(arguments.concrete(shape), "float32"))
    found = _weights(layer)
    if found != payload["weights"]:
        raise ValueError(
            f"its config rebuilds other weights: {found} instead of {payload['weights']}"
        )
    spaces, reasons, residual = derive(layer, shape, described)
    return {
        "spaces": [
            [
                s.name,
                s.size,
                [[e.weight, e.axis, e.ids.tolist(), e.closes] for e in s.entries],
            ]
            for s in spaces
        ],
        "reasons": {str(k): v for k, v in reasons.items()},
        "residual": residual,
    }


_PROCESS = {}


def _stored(layer):
    """`{name: value}` of `__init__`'s required arguments that `layer` keeps as
    plain attributes (for a config that leaves one out)."""
    found = {}
    for name, parameter in inspect.signature(type(layer).__init__).parameters.items():
        value = getattr(layer, name, None)
        if parameter.default is inspect.Parameter.empty and isinstance(
            value, (bool, int, float, str)
        ):
            found[name] = value
    return found


def _payload(layer, input_shape, described):
    cls = type(layer)
    if cls.__module__ == "__main__" or "<locals>" in cls.__qualname__:
        raise ValueError(
            f"its class {cls.__qualname__} is defined in"
            f" {'a function' if '<locals>' in cls.__qualname__ else '__main__'},"
            " so a JAX worker process cannot import it (define it in a module)"
        )
    return {
        "module": cls.__module__,
        "qualname": cls.__qualname__,
        "config": hub_shrink.config_of(layer),
        "shape": list(input_shape),
        "arguments": described or arguments.FIRST_ONLY,
        "stored": _stored(layer),
        "weights": _weights(layer),
    }


def _worker():
    """The running worker process (started once)."""
    process = _PROCESS.get("process")
    if process is not None and process.poll() is None:
        return process
    env = dict(os.environ, KERAS_BACKEND="jax", TF_CPP_MIN_LOG_LEVEL="2")
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    errors = tempfile.TemporaryFile("w+")
    process = subprocess.Popen(  # noqa: S603 - this interpreter, our own code
        [sys.executable, "-c", _WORKER],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=errors,
        bufsize=0,  # unbuffered: `select` sees every byte not yet read
        env=env,
    )
    _PROCESS.update(process=process, errors=errors)
    return process


def _stop():
    process = _PROCESS.pop("process", None)
    if process is not None and process.poll() is None:
        process.stdin.close()
        process.wait(timeout=30)


atexit.register(_stop)


def _answer(process):
    """The worker's next answer line, or None when it died or timed out."""
    with selectors.DefaultSelector() as selector:
        selector.register(process.stdout, selectors.EVENT_READ)
        while selector.select(timeout=_TIMEOUT_S):
            line = process.stdout.readline().decode()
            if not line:
                return None
            if line.startswith(_MARK):
                return json.loads(line[len(_MARK) :])
    return None


def derive_in_worker(layer, input_shape, described=None):
    """`coupling.derive(layer, input_shape, described)`, computed in the JAX worker process.

    Raises:
      ValueError: naming why the worker could not derive it (its class not
        importable, its config not rebuilding its weights, no JAX, the
        worker's error).
    """
    try:
        text = json.dumps(_payload(layer, input_shape, described), default=_plain)
    except TypeError as error:
        raise ValueError(f"its config is not JSON for a JAX worker: {error}") from None
    process = _worker()
    try:
        process.stdin.write((text + "\n").encode())
        out = _answer(process)
    except OSError:
        out = None
    if out is None:
        process.kill()
        errors = _PROCESS["errors"]
        errors.seek(0)
        last = (errors.read().strip().splitlines() or ["no answer"])[-1]
        raise ValueError(f"the JAX worker that derives it failed: {last}")
    if "error" in out:
        raise ValueError(f"the JAX worker that derives it failed: {out['error']}")
    found = out["found"]
    spaces = [
        derive_spaces.Space(
            name,
            size,
            tuple(
                derive_spaces.Entry(w, a, np.asarray(ids), bool(c))
                for w, a, ids, c in entries
            ),
        )
        for name, size, entries in found["spaces"]
    ]
    reasons = {int(k): v for k, v in found["reasons"].items()}
    return spaces, reasons, bool(found["residual"])


def _weights(layer):
    """`[[path after the layer's name, shape]]` of `layer`'s weights.

    Keras numbers the names it makes up per process (`dense`, `dense_1`...),
    so a sublayer's name gets another number in the worker than here: each
    part of the path is compared without its `_N` suffix.
    """
    return [
        [
            "/".join(re.sub(r"_\d+$", "", part) for part in v.path.split("/")[1:]),
            list(v.shape),
        ]
        for v in layer.weights
    ]


def _plain(value):
    if isinstance(value, (np.integer, np.floating)):
        return value.item()
    raise TypeError(f"{type(value).__name__} {value!r}")
