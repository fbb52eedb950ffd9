"""Deriving a coupling under TensorFlow: the layer rebuilt in a JAX worker process.

The derivation reads a jaxpr, which only the JAX backend makes. Under
TensorFlow, a Python process run with `KERAS_BACKEND=jax` is started once
(on the first layer to derive; about 10 s) and kept: for each layer, it
imports the layer's class, rebuilds it from its config, builds it at the
input shape, checks that its weights have the original's paths (after the
layer's name) and shapes, and derives it (`coupling.derive`); the unit
spaces come back by weight index. What it finds is then held to the
gradient check under TensorFlow, on the real layer, like any coupling.

A layer whose class is not importable by module and name (defined in
`__main__` or inside a function), whose config does not rebuild the same
weights, or a process without JAX, is refused with that reason.
"""

import atexit
import json
import os
import selectors
import subprocess
import sys
import tempfile

import numpy as np

from maskfit.structured.derive import spaces as derive_spaces

__all__ = ["derive_in_worker"]

_TIMEOUT_S = 600
_MARK = "MASKFIT-DERIVED"

_WORKER = """
import importlib, json, sys
import keras
from maskfit.structured.derive import coupling

def derive(payload):
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
    return {
        "spaces": [
            [s.name, s.size, [[e.weight, e.axis, e.ids.tolist(), e.closes] for e in s.entries]]
            for s in spaces
        ],
        "reasons": {str(k): v for k, v in reasons.items()},
        "residual": residual,
    }

for line in sys.stdin:
    try:
        out = {"found": derive(json.loads(line))}
    except Exception as error:
        out = {"error": f"{type(error).__name__}: {error}"}
    print("MASKFIT-DERIVED" + json.dumps(out), flush=True)
"""

_PROCESS = {}


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


def derive_in_worker(layer, input_shape):
    """`coupling.derive(layer, input_shape)`, computed in the JAX worker process.

    Raises:
      ValueError: naming why the worker could not derive it (its class not
        importable, its config not rebuilding its weights, no JAX, the
        worker's error).
    """
    try:
        text = json.dumps(_payload(layer, input_shape), default=_plain)
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


def _plain(value):
    if isinstance(value, (np.integer, np.floating)):
        return value.item()
    raise TypeError(f"{type(value).__name__} {value!r}")
