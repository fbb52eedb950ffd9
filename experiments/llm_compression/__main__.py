r"""One-shot pruning of a small trained Llama: magnitude, Wanda and SparseGPT, healed, quantized.

The keras_hub Llama of `experiments.transformer_pruning` (4 blocks, width
128, the shared initial weights, trained on Python's own text as bytes) is
pruned one-shot with `maskfit.prune_oneshot` per method (magnitude, Wanda,
SparseGPT) and target (50/60/70% unstructured, 2:4, 4:8) from calibration
windows; the 2:4 models are healed with their masks, and on the first
seed quantized after healing (int8, int4). Per method and
target over seeds: validation perplexity before and after healing, the one-
shot pass's time and peak NumPy memory; after quantization, the pruned
entries still 0 and the saved file's size. Writes `config.json`,
`metrics.json`, `llm_compression.md` and `llm_compression.png` under
`--workdir`. The logic is in `experiments.llm_compression.lib`.

Usage (docs/oneshot.md has the results):
  python -m experiments.llm_compression --workdir=/tmp/llm_compression
"""

from absl import app

from experiments.common import cli
from experiments.llm_compression.lib import Config, run

main = cli.config_main(Config, run, show=cli.print_file("llm_compression.md"))

if __name__ == "__main__":
    app.run(main)
