r"""Is a shrunk model as fast as one built at its size? A latency check.

Shrinks the default Llama (one-shot magnitude, from its initial weights:
latency does not depend on their values) and builds beside each shrunk
model the keras_hub model of the shrunk config from scratch, holding the same
weights; on the PyTorch side, the Torch-Pruning model beside a
`LlamaForCausalLM` built at the pruned sizes. All are timed in one process,
one thread, in interleaved rounds (`experiments.common.latency`), through
`tf.function`, XLA and PyTorch; each ratio is to its own path's dense model.
If a shrunk model is as fast as the hand-built one, what is left of a gap
between frameworks is their kernels, not the shrinking.

Usage (needs the benchmark extra for the PyTorch rows):
  python -m experiments.transformer_pruning.handbuilt
"""

import copy
import os

from absl import app

__all__ = ["run"]


def _torch_models(arch, fraction, seed):
    from transformers import LlamaConfig, LlamaForCausalLM

    from experiments.transformer_pruning import torch_arm

    dense = torch_arm.build(arch, seed)
    pruned = torch_arm.prune(copy.deepcopy(dense), fraction, 4)
    attention = pruned.model.layers[0].self_attn
    head_dim = arch.hidden // arch.query_heads
    heads = attention.q_proj.out_features // head_dim
    config = LlamaConfig(
        vocab_size=arch.vocabulary,
        hidden_size=arch.hidden,
        intermediate_size=pruned.model.layers[0].mlp.gate_proj.out_features,
        num_hidden_layers=arch.layers,
        num_attention_heads=heads,
        num_key_value_heads=heads,
        head_dim=head_dim,
        max_position_embeddings=arch.context,
        rms_norm_eps=1e-6,
        tie_word_embeddings=False,
    )
    built = LlamaForCausalLM(config)
    built.load_state_dict(pruned.state_dict())
    return dense, pruned, built.eval()


def run(fractions=(0.25, 0.5), batches=(16, 1), rounds=7, seed=0, arch=None, threads=1):
    """Times dense, shrunk and hand-built models; returns `{(batch, path, name): (ms, ratio)}`.

    Each hand-built model is checked to compute the shrunk one's logits first.

    Args:
      arch: the `keras_arm.Architecture` (default: the experiment's).
      threads: TensorFlow's intra- and inter-op threads, set first (None:
        leave TensorFlow's, in a process that has already run it).
    """
    import numpy as np

    from experiments.common import latency

    if threads is not None:
        latency.set_tensorflow_threads(threads, threads)
    from experiments.transformer_pruning import corpus, keras_arm, timing, torch_arm

    arch = arch or keras_arm.Architecture()
    calibration = corpus.load().batches(1, 8, arch.context, seed)[0]
    dense = keras_arm.build(arch, seed)
    keras_models, torch_models = {"dense": dense}, {}
    with_torch = not torch_arm.missing()
    if with_torch:
        import torch

        torch.set_num_threads(1)
    for fraction in fractions:
        model = keras_arm.clone(dense, arch, seed)
        shrunk = keras_arm.prune_one_shot(model, "magnitude", fraction, calibration, 4)
        backbone = type(shrunk.backbone).from_config(shrunk.backbone.get_config())
        built = type(shrunk)(backbone=backbone, preprocessor=None)
        built.set_weights(shrunk.get_weights())
        tokens, _ = keras_arm.model_inputs(calibration[:1])
        np.testing.assert_allclose(
            np.asarray(built(tokens)), np.asarray(shrunk(tokens)), rtol=1e-5, atol=1e-5
        )
        keras_models[f"shrunk {fraction:.0%}"] = shrunk
        keras_models[f"hand-built {fraction:.0%}"] = built
        if with_torch:
            torch_dense, pruned, built = _torch_models(arch, fraction, seed)
            torch_models.setdefault("dense", torch_dense)
            torch_models[f"shrunk {fraction:.0%}"] = pruned
            torch_models[f"hand-built {fraction:.0%}"] = built
    results = {}
    for batch in batches:
        calls = {}
        for path in ("tensorflow", "xla"):
            for name, model in keras_models.items():
                calls[(path, name)] = timing.keras_call(
                    model, batch, arch.context, arch.vocabulary, path
                )[0]
        for name, model in torch_models.items():
            calls[("torch", name)] = torch_arm.inference(model, batch, arch.context)
        keys = list(calls)
        flat = {str(i): calls[key] for i, key in enumerate(keys)}
        per_round = latency.calls_per_round(flat["0"], 0.2, most=50)
        wall, _ = latency.interleaved(flat, rounds, per_round)
        for path in dict.fromkeys(key[0] for key in keys):
            own = [str(i) for i, key in enumerate(keys) if key[0] == path]
            base = next(i for i in own if keys[int(i)][1] == "dense")
            summary = latency.summarize({i: wall[i] for i in own}, base)
            for i in own:
                results[(batch, path, keys[int(i)][1])] = (
                    summary[i]["ms"]["median"],
                    summary[i]["ratio"]["median"],
                )
    return results


def main(argv):
    del argv
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    print("| batch | path | model | ms | ratio to dense |")
    print("| --- | --- | --- | --- | --- |")
    for (batch, path, name), (ms, ratio) in run().items():
        print(f"| {batch} | {path} | {name} | {ms:.2f} | {ratio:.3f} |")


if __name__ == "__main__":
    app.run(main)
