#!/usr/bin/env bash
# The masked training step against stock Keras on a CUDA machine, as one table.
#
# Runs `benchmarks.jax_step_time` (Keras on JAX, jit, AdamW, each contender beside stock
# in one process) at issue 43's sizes: the 4x4096 MLP (batch 1024) with BERT-base (12
# layers, 768, seq 128, batch 32), then the 4x1024 MLP (batch 256) with the small BERT
# (2 layers, 128). Each row: step time, masked/stock ratio (median over rounds, spread),
# and what XLA compiled for the GPU (fusions, bytes accessed, their ratios to stock).
#
#   pip install -e ".[test]" && pip install -U "jax[cuda12]"
#   bash benchmarks/gpu.sh [WORKDIR]          # default /tmp/maskfit_gpu
#
# It stops unless JAX runs on a GPU. GPU_SH_DRY_RUN=1 runs it tiny on any machine (to
# check the script, not to measure).
set -euo pipefail
cd "$(dirname "$0")/.."
WORKDIR=${1:-/tmp/maskfit_gpu}
PYTHON=${PYTHON:-python}

if [[ "${GPU_SH_DRY_RUN:-0}" == 1 ]]; then
  TIMING=(--steps=2 --steps_per_execution=1 --warmup_steps=1 --repeats=1)
  BIG=(--mlp_depth=1 --mlp_width=16 --mlp_batch=8 --bert_layers=1 --bert_hidden=8
       --bert_heads=2 --bert_intermediate=16 --bert_vocabulary=20 --bert_sequence=4
       --bert_batch=2)
  SMALL=("${BIG[@]}" --mlp_width=8)
else
  KERAS_BACKEND=jax "$PYTHON" -c '
import sys, jax
if jax.default_backend() != "gpu":
    sys.exit(f"benchmarks/gpu.sh: JAX runs on {jax.default_backend()!r}, not a GPU;"
             " install jax with CUDA (pip install -U \"jax[cuda12]\") on a CUDA machine,"
             " or set GPU_SH_DRY_RUN=1 to check the script.")
print("GPU:", jax.devices()[0].device_kind)
'
  TIMING=(--steps=50 --repeats=9)
  BIG=(--mlp_width=4096 --mlp_batch=1024 --bert_layers=12 --bert_hidden=768
       --bert_heads=12 --bert_intermediate=3072 --bert_vocabulary=30522)
  SMALL=()
fi

"$PYTHON" -m benchmarks.jax_step_time --workdir "$WORKDIR/large" "${TIMING[@]}" "${BIG[@]}"
"$PYTHON" -m benchmarks.jax_step_time --workdir "$WORKDIR/small" "${TIMING[@]}" "${SMALL[@]}"

"$PYTHON" - "$WORKDIR" <<'PY'
import json, os, sys

workdir = sys.argv[1]
print()
print("| sizes | model | mask | ms/step | ratio | spread | CPU-time ratio"
      " | fusions | fusions ratio | MB accessed | bytes ratio |")
print("|---|---|---|---|---|---|---|---|---|---|---|")
for sizes, label in (("large", "4x4096 MLP / BERT-base"), ("small", "4x1024 MLP / BERT small")):
    with open(os.path.join(workdir, sizes, "jax_step_time.json")) as f:
        found = json.load(f)
    for row in found["rows"]:
        print(
            f"| {label} | {row['model']} | {row['mask']} | {row['step_ms']:.3f}"
            f" | {row['ratio_median']:.3f} | [{row['ratio_min']:.3f}, {row['ratio_max']:.3f}]"
            f" | {row['cpu_ratio_median']:.3f} | {row['fusions']} | {row['fusions_ratio']:.3f}"
            f" | {row['bytes_accessed'] / 1e6:.1f} | {row['bytes_ratio']:.4f} |"
        )
print(f"\n{found['machine']}; rows in {workdir}/{{large,small}}/jax_step_time.json")
PY
