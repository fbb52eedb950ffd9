"""`benchmarks.scale`: how each phase of maskfit's cost grows with a Llama's size.

`lib.py` holds the sizes, `run` (one process per size, `measure.py`), the
fitted growth exponents, the table and the log-log figure; `__main__.py`
its flags.
"""
