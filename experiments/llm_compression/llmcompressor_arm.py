"""The llmcompressor arm: Hugging Face's Llama of the same weights, pruned by llmcompressor.

Run in a process of its own, in a virtual environment with llmcompressor
(torch and transformers; no TensorFlow, no Keras, no maskfit): `peer.py`
writes the `.npz` this reads and starts it as

  python -m experiments.llm_compression.llmcompressor_arm IN.npz OUT.json

From the `.npz` (`peer.write_inputs`): the trained dense keras_hub Llama's
weights in Hugging Face's names and layout (`keras_arm.hf_weights`), the
calibration windows in maskfit's order and batches, the validation windows,
a few windows with the Keras model's logits on them, the methods and
targets. For the dense model it reports the largest difference between
`LlamaForCausalLM`'s logits and keras_hub's, and its perplexity; for each
method and target, a fresh model of the same weights pruned by
`llmcompressor.oneshot` (`SparseGPTModifier`, `WandaPruningModifier`,
`MagnitudePruningModifier`; unstructured `sparsity=s` or
`mask_structure="N:M"`), the wall time of the `oneshot` call alone, the
zeros of the 28 pruned weights and the perplexity on the same validation
windows. A method llmcompressor cannot run is reported with its error.
"""

import json
import os
import shutil
import sys
import tempfile
import time
import traceback
import types

import numpy as np

from experiments.transformer_pruning import torch_arm

__all__ = ["main", "recipe", "run"]

METHODS = ("magnitude", "wanda", "sparsegpt")
_NO_TOKENIZER = types.SimpleNamespace(name="bytes: the windows are token ids")


def recipe(method, target):
    """llmcompressor's modifier for `method` at `target` ("50%" or "2:4").

    The modifiers' own defaults otherwise (SparseGPT: `block_size=128`,
    `dampening_frac=0.01`, as maskfit's), every `Linear` of the decoder
    layers pruned, `lm_head` left dense.
    """
    from llmcompressor.modifiers.pruning import (
        MagnitudePruningModifier,
        SparseGPTModifier,
        WandaPruningModifier,
    )

    if target.endswith("%"):
        sparsity, structure = float(target[:-1]) / 100, "0:0"
    else:
        n, m = (int(p) for p in target.split(":"))
        sparsity, structure = n / m, target
    common = dict(targets=["Linear"], ignore=["re:.*lm_head"])
    if method == "sparsegpt":
        return SparseGPTModifier(sparsity=sparsity, mask_structure=structure, **common)
    if method == "wanda":
        return WandaPruningModifier(
            sparsity=sparsity, mask_structure=structure, **common
        )
    if method == "magnitude":
        return MagnitudePruningModifier(
            targets=["re:.*layers.*proj$"],
            init_sparsity=sparsity,
            final_sparsity=sparsity,
            start=0,
            end=1,
            update=1,
            mask_structure="unstructured" if structure == "0:0" else structure,
        )
    raise ValueError(f"Received an unknown method {method!r}, expected {METHODS}")


def _loader(windows, batch_size):
    """A DataLoader of the calibration windows, in order, `batch_size` a batch."""
    import torch

    tokens = torch.as_tensor(np.asarray(windows, np.int64))
    samples = [
        {"input_ids": tokens[i : i + batch_size],
         "attention_mask": torch.ones_like(tokens[i : i + batch_size])}
        for i in range(0, len(tokens), batch_size)
    ]  # fmt: skip
    # Each item is a whole batch already: batch_size=None passes it through.
    return torch.utils.data.DataLoader(samples, batch_size=None, shuffle=False)


def _zeros(model):
    """`(zeros, entries)` of the decoder layers' Linear weights (the pruned ones)."""
    zeros = total = 0
    for layer in model.model.layers:
        for name, module in layer.named_modules():
            if name.endswith("_proj"):
                weight = module.weight.detach().numpy()
                zeros += int(np.sum(weight == 0))
                total += weight.size
    return zeros, total


def _prune(checkpoint, method, target, calibration, batch_size, validation):
    from llmcompressor import oneshot
    from transformers import LlamaForCausalLM

    # From a saved checkpoint: oneshot reads the model's config again from
    # `config.name_or_path` (a model built in memory fails there, with
    # "Repo id must use alphanumeric chars ...: ''").
    model = LlamaForCausalLM.from_pretrained(checkpoint, dtype="float32")
    model.eval()
    loader = _loader(calibration, batch_size)
    start = time.perf_counter()
    cpu = time.process_time()
    try:
        # The windows are token ids already (bytes) and a DataLoader is used as
        # it is, so no tokenizer is read; oneshot only asks for one to exist.
        oneshot(model=model, dataset=loader, recipe=recipe(method, target),
                processor=_NO_TOKENIZER, num_calibration_samples=len(calibration))  # fmt: skip
    except Exception as error:  # recorded, so the other methods still compare
        return dict(failure=f"{type(error).__name__}: {error}",
                    traceback=traceback.format_exc())  # fmt: skip
    seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
    zeros, total = _zeros(model)
    return dict(
        seconds=seconds, cpu_seconds=cpu, sparsity=zeros / total,
        perplexity=torch_arm.perplexity(model, validation),
    )  # fmt: skip


def run(inputs):
    """The arm's rows for the arrays of `peer.write_inputs` (a mapping)."""
    import llmcompressor
    import torch
    import transformers

    fields = json.loads(str(inputs["meta"]))
    arch = types.SimpleNamespace(**fields["arch"])
    seed = fields["seed"]
    values = {k[2:]: np.asarray(inputs[k]) for k in inputs.files if k[:2] == "w/"}
    model = torch_arm.build(arch, seed, values)
    with torch.inference_mode():
        logits = model(torch.as_tensor(inputs["check_tokens"].astype(np.int64))).logits
    expected = inputs["check_logits"]
    validation = inputs["validation"]
    dense = dict(
        framework="llmcompressor", method="dense", target="-", seed=seed,
        perplexity=torch_arm.perplexity(model, validation),
        logits_max_difference=float(np.abs(logits.numpy() - expected).max()),
        logits_scale=float(np.abs(expected).max()),
    )  # fmt: skip
    rows = [dense]
    checkpoint = tempfile.mkdtemp(prefix="llmcompressor_arm_")
    model.save_pretrained(checkpoint)
    for method in fields["methods"]:
        for target in fields["targets"]:
            row = dict(framework="llmcompressor", method=method, target=target,
                       seed=seed)  # fmt: skip
            row.update(
                _prune(
                    checkpoint,
                    method,
                    target,
                    inputs["calibration"],
                    fields["calibration_batch"],
                    validation,
                )  # fmt: skip
            )
            rows.append(row)
    shutil.rmtree(checkpoint, ignore_errors=True)
    versions = {
        "llmcompressor": llmcompressor.__version__,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "torch_threads": torch.get_num_threads(),
    }
    return {"versions": versions, "runs": rows}


def main(argv):
    if len(argv) != 3:
        raise SystemExit(f"usage: python -m {__name__} IN.npz OUT.json")
    os.environ.setdefault("USE_TF", "0")
    with np.load(argv[1]) as inputs:
        result = run(inputs)
    with open(argv[2], "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main(sys.argv)
