"""A small Llama causal LM pruned (heads, FFN units) with maskfit, beside Torch-Pruning.

`python -m experiments.transformer_pruning --workdir DIR`; see `__main__`.
"""
