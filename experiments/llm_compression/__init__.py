"""One-shot pruning of a trained Llama (magnitude, Wanda, SparseGPT), healed and quantized."""
