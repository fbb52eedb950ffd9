"""Fine-tuning recipes compared on a small keras_hub transformer (docs/finetune_recipes.md).

`python -m experiments.finetune_recipes --workdir DIR`; the library is
`experiments.finetune_recipes.lib.run(config, workdir)`.
"""
