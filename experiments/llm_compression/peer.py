"""The side by side with llmcompressor: its arm run in its own virtual environment.

llmcompressor needs torch and transformers releases that clash with the
`benchmark` extra's (docs/oneshot.md has the recipe of its venv), so it
runs in a process of its own, started with that venv's Python
(`Config.peer_python`). The two sides exchange arrays through one `.npz`
file per seed (`write_inputs`): the trained dense Llama's weights in Hugging
Face's names and layout (`keras_arm.hf_weights`, NumPy only), the same
calibration windows in the same order and batches as maskfit's, the same
validation windows, and Keras's logits on a few windows, which the arm
compares with `LlamaForCausalLM`'s before it prunes anything.
`experiments.llm_compression.llmcompressor_arm` is the other side.
"""

import dataclasses
import json
import os
import subprocess
import sys

import numpy as np

from experiments.transformer_pruning import keras_arm

__all__ = ["CHECK_WINDOWS", "run_arm", "write_inputs"]

CHECK_WINDOWS = 4  # validation windows whose logits the two models compare

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def write_inputs(path, dense, arch, seed, calibration, batch, validation, methods,
                 targets):  # fmt: skip
    """Writes the arm's `.npz`: weights, windows, Keras's logits, what to run.

    Args:
      path: the `.npz` file written.
      dense: the trained dense keras_hub `LlamaCausalLM`.
      arch: its `keras_arm.Architecture`.
      seed: the seed it was trained with.
      calibration: the calibration windows, `(count, context)` tokens, in
        maskfit's order.
      batch: calibration windows per forward pass (maskfit's batches).
      validation: the validation windows, `(count, context + 1)` tokens.
      methods: the methods the arm runs.
      targets: the targets ("50%", "2:4") it prunes to.
    """
    check = validation[:CHECK_WINDOWS]
    x, _ = keras_arm.model_inputs(check)
    logits = np.asarray(dense(x, training=False), np.float32)
    meta = dict(
        arch=dataclasses.asdict(arch), seed=seed, methods=list(methods),
        targets=list(targets), calibration_batch=batch,
    )  # fmt: skip
    weights = {f"w/{k}": v for k, v in keras_arm.hf_weights(dense, arch).items()}
    np.savez(
        path, meta=json.dumps(meta), calibration=np.asarray(calibration, np.int64),
        validation=np.asarray(validation, np.int64), check_tokens=x["token_ids"],
        check_logits=logits, **weights,
    )  # fmt: skip


def run_arm(python, inputs, output, nice=5):
    """Runs the arm with `python` on `inputs` (`.npz`); returns its JSON.

    Niced by `nice` more than this process (the machine is shared; 0: at this
    process's own level, as `experiments.llm_compression.timing` runs it);
    its own process, so its torch threads and memory never meet
    TensorFlow's. Raises RuntimeError with the arm's output when it fails as
    a whole (a method it cannot run is a row with an `error`, not a failure).
    """
    env = dict(os.environ, PYTHONPATH=_ROOT, USE_TF="0", TF_CPP_MIN_LOG_LEVEL="2")
    command = [python, "-m", "experiments.llm_compression.llmcompressor_arm",
               inputs, output]  # fmt: skip
    if nice and sys.platform.startswith("linux"):
        command = ["nice", "-n", str(int(nice))] + command
    done = subprocess.run(command, cwd=_ROOT, env=env, capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(
            f"The llmcompressor arm ({python}) failed with exit status"
            f" {done.returncode}; its last output:\n{done.stderr[-3000:]}"
        )
    with open(output) as f:
        return json.load(f)
