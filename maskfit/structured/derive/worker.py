"""Deriving a coupling under TensorFlow: the layer rebuilt in a JAX worker process.

The derivation reads a jaxpr, which only the JAX backend makes. Under
TensorFlow, the layer's class is imported in a fresh Python process run
with `KERAS_BACKEND=jax`, rebuilt from its config, built at the input
shape, and derived there (`coupling.derive`); the unit spaces come back by
weight index, after the worker has checked that the rebuilt layer's
weights have the same paths' tails and shapes as the original's. What the
worker finds is then held to the gradient check under TensorFlow, on the
real layer, like any coupling.

A layer whose class is not importable by module and name (defined in
`__main__` or inside a function), or whose config does not rebuild the
same weights, or a process without JAX, is refused with that reason.
"""

import json
import os
import subprocess
import sys

import numpy as np

from maskfit.structured.derive import spaces as derive_spaces

__all__ = ["derive_in_worker"]

_TIMEOUT_S = 600

_WORKER = """
import importlib, json, sys
payload = json.load(sys.stdin)
import keras
from maskfit.structured.derive import coupling
cls = importlib.import_module(payload["module"])
for part in payload["qualname"].split("."):
    cls = getattr(cls, part)
layer = cls.from_config(payload["config"])
shape = tuple(payload["shape"])
layer.build(shape)
found = [[v.path.split("/", 1)[-1], list(v.shape)] for v in layer.weights]
if found != payload["weights"]:
    raise ValueError(
        f"its config rebuilds other weights: {found} instead of {payload['weights']}"
    )
spaces, reasons, residual = coupling.derive(layer, shape)
out = {
    "spaces": [
        [s.name, s.size, [[e.weight, e.axis, e.ids.tolist(), e.closes] for e in s.entries]]
        for s in spaces
    ],
    "reasons": {str(k): v for k, v in reasons.items()},
    "residual": residual,
}
print("MASKFIT-DERIVED" + json.dumps(out))
"""


def _payload(layer, input_shape):
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
        "config": layer.get_config(),
        "shape": list(input_shape),
        "weights": [[v.path.split("/", 1)[-1], list(v.shape)] for v in layer.weights],
    }


def derive_in_worker(layer, input_shape):
    """`coupling.derive(layer, input_shape)`, computed in a JAX worker process.

    Raises:
      ValueError: naming why the worker could not derive it (its class not
        importable, its config not rebuilding its weights, no JAX, the
        worker's error).
    """
    try:
        text = json.dumps(_payload(layer, input_shape), default=_plain)
    except TypeError as error:
        raise ValueError(f"its config is not JSON for a JAX worker: {error}") from None
    env = dict(os.environ, KERAS_BACKEND="jax", TF_CPP_MIN_LOG_LEVEL="2")
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    done = subprocess.run(
        [sys.executable, "-c", _WORKER],
        input=text,
        capture_output=True,
        text=True,
        env=env,
        timeout=_TIMEOUT_S,
        check=False,
    )
    found = [
        line for line in done.stdout.splitlines() if line.startswith("MASKFIT-DERIVED")
    ]
    if done.returncode or not found:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise ValueError(f"the JAX worker that derives it failed: {last}")
    out = json.loads(found[-1][len("MASKFIT-DERIVED") :])
    spaces = [
        derive_spaces.Space(
            name,
            size,
            tuple(
                derive_spaces.Entry(w, a, np.asarray(ids), bool(c))
                for w, a, ids, c in entries
            ),
        )
        for name, size, entries in out["spaces"]
    ]
    reasons = {int(k): v for k, v in out["reasons"].items()}
    return spaces, reasons, bool(out["residual"])


def _plain(value):
    if isinstance(value, (np.integer, np.floating)):
        return value.item()
    raise TypeError(f"{type(value).__name__} {value!r}")
