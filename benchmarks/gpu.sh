#!/usr/bin/env bash
# Issue 43's GPU measurements in one go, printing one table (docs/benchmarks.md).
#
#   bash benchmarks/gpu.sh [WORKDIR]            # on a CUDA machine, Keras on JAX
#   GPU_SH_TINY=1 bash benchmarks/gpu.sh DIR    # a rehearsal at tiny sizes (CPU)
#
# It stops unless JAX runs on a GPU (GPU_SH_DRY_RUN=1 is GPU_SH_TINY=1).
#
# 1. benchmarks.jax_step_time (masked / stock, AdamW, jit) on the issue's four
#    models: MLP 4x4096 batch 1024, MLP 4x1024 batch 256, BERT small (2 layers,
#    128) and BERT-base (12 layers, 768, seq 128, batch 32);
# 2. benchmarks.scale.latency at 1.1B (TinyLlama's shape): select_units(0.5),
#    shrink(uniform=True), the shrunk logits against the masked model's, and
#    dense/shrunk latency at 128 tokens, batch 1 and 16, float32 and bfloat16.
# Needs the `hub` and `experiments` extras and a CUDA build of jax
# (pip install "jax[cuda12]"); it prints the device it ran on.
set -euo pipefail
WORKDIR="${1:-runs/gpu}"
mkdir -p "$WORKDIR"
export KERAS_BACKEND=jax TF_CPP_MIN_LOG_LEVEL=2
PY="${PYTHON:-python}"
if [[ "${GPU_SH_DRY_RUN:-0}" == 1 ]]; then
  GPU_SH_TINY=1
fi
if [[ -z "${GPU_SH_TINY:-}" ]]; then
  "$PY" -c '
import sys, jax
if jax.default_backend() != "gpu":
    sys.exit(f"benchmarks/gpu.sh: JAX runs on {jax.default_backend()!r}, not a GPU;"
             " install jax with CUDA (pip install -U \"jax[cuda12]\") on a CUDA machine,"
             " or set GPU_SH_TINY=1 to rehearse the script.")
'
fi
if [[ -n "${GPU_SH_TINY:-}" ]]; then
  MLPS=("2 16 8" "1 8 4"); BERTS=("1 16 2 32 2 4" "2 16 2 32 2 4")
  TIMING=(--steps=2 --repeats=1 --warmup_steps=1 --steps_per_execution=1)
  LATENCY=(--size=tiny --tokens=8 --repeats=1)
else
  MLPS=("4 4096 1024" "4 1024 256"); BERTS=("2 128 2 512 128 32" "12 768 12 3072 128 32")
  TIMING=(--repeats=9 --steps=10)
  LATENCY=(--size=1.1B)
fi
GPU_SH_DEVICE="$("$PY" -c "import jax; d = jax.devices()[0]; print(d.platform, d.device_kind, '| jax', jax.__version__)")"
export GPU_SH_DEVICE
echo "device: $GPU_SH_DEVICE"
i=0
for mlp in "${MLPS[@]}"; do
  read -r depth width batch <<<"$mlp"
  "$PY" -m benchmarks.jax_step_time --workdir "$WORKDIR/step_mlp_$i" --models=mlp \
    --mlp_depth="$depth" --mlp_width="$width" --mlp_batch="$batch" "${TIMING[@]}" >/dev/null
  i=$((i + 1))
done
i=0
for bert in "${BERTS[@]}"; do
  read -r layers hidden heads inter seq batch <<<"$bert"
  "$PY" -m benchmarks.jax_step_time --workdir "$WORKDIR/step_bert_$i" --models=bert \
    --bert_layers="$layers" --bert_hidden="$hidden" --bert_heads="$heads" \
    --bert_intermediate="$inter" --bert_sequence="$seq" --bert_batch="$batch" \
    "${TIMING[@]}" >/dev/null
  i=$((i + 1))
done
"$PY" -m benchmarks.scale.latency --workdir "$WORKDIR/latency" "${LATENCY[@]}" >/dev/null
"$PY" -m benchmarks.scale.gpu_table "$WORKDIR"
