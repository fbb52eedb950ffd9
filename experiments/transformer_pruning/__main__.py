r"""Pruning a small Llama causal LM: perplexity against measured latency, beside Torch-Pruning.

A keras_hub Llama (4 blocks, width 128, 4 heads, gated FFN of 344, context
128) learns Python's own text (`pydoc_data.topics` and standard-library
modules, as bytes); maskfit prunes 25/50/75% of its heads and FFN units
with magnitude, Taylor and activation importance, in one shot and gradually
in `fit`, heals and shrinks it; Hugging Face's `LlamaForCausalLM` of the same
sizes, trained on the same windows in the same order, is pruned with
Torch-Pruning as its LLM example does and healed alike. Per fraction and
importance: parameters, validation perplexity over seeds, and the shrunk
model's latency against the dense one through TensorFlow, XLA, LiteRT and
PyTorch (one thread, interleaved rounds). Writes `config.json`,
`metrics.json`, `transformer_pruning.md` and `transformer_pruning.png` under
`--workdir`. The Torch-Pruning arm needs the `benchmark` extra and is
skipped, saying so, without it. The logic is in
`experiments.transformer_pruning.lib`.

Usage (docs/transformer_pruning.md has the results):
  python -m experiments.transformer_pruning --workdir=/tmp/transformer_pruning
  python -m experiments.transformer_pruning --kv_heads=2 --notorch \
      --workdir=/tmp/transformer_pruning_gqa
"""

from absl import app

from experiments.common import cli
from experiments.transformer_pruning.lib import Config, run

main = cli.config_main(Config, run, show=cli.print_file("transformer_pruning.md"))

if __name__ == "__main__":
    app.run(main)
