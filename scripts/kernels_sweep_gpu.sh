#!/usr/bin/env bash
# Every GEMM-kernel measurement of one GPU lease, in one command (JSON and logs under $OUT):
#   1. which Triton features the image has, warp specialization compiled and timed;
#   2. the tuning space compiled ahead in parallel processes (Triton's disk cache);
#   3. tests/gpu/test_kernels_decode_gpu.py (bf16 numerics of the decode kernel);
#   4. decode GEMMs (bench_decode_gemm.py): decode kernel / persistent / space vs cuBLAS;
#   5. bench_gemm.py's full and chunk shapes: the widened space vs the space before it;
#   6. tune_fused_gpu.py's shapes: the fused GEMM, its tile tuned over the widened space.
# Each phase has its own time cap (seconds: PROBE_S PREWARM_S TESTS_S DECODE_S GEMM_S FUSED_S;
# on one H100, 2026-11-25, probe and prewarm did not finish in 20 s and 35 s, the decode phase
# took 68 s, bench_gemm 84 s, and the fused phase 40 s before its first shape)
# and writes after every shape, so what ran comes back even when a cap cuts it short. The
# tuning cache the phases fill is $OUT/cache/gemm_tuning.json.
set -u
cd "$(dirname "$0")/.."
: "${OUT:?set OUT}"
export PYTHONUNBUFFERED=1 CUDA_MODULE_LOADING=EAGER
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export TRITON_CACHE_DIR=${TRITON_CACHE_DIR:-/tmp/ficco_triton_cache}
export FICCO_CACHE_DIR=$OUT/cache
mkdir -p "$FICCO_CACHE_DIR"
COMMIT=${COMMIT:-unknown}
LOG=$OUT/sweep.log
phase() {  # name, cap, command...
  local name=$1 cap=$2
  shift 2
  echo "=== $name (cap ${cap}s) $(date -u +%T)" | tee -a "$LOG"
  timeout "$cap" "$@" 2>&1 | tee -a "$LOG" | tail -n 12
  echo "=== $name rc=${PIPESTATUS[0]} $(date -u +%T)" | tee -a "$LOG"
}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,power.limit,temperature.gpu \
  --format=csv 2>&1 | tee -a "$LOG"
phase probe "${PROBE_S:-60}" python3 scripts/probe_triton_features.py
phase prewarm "${PREWARM_S:-90}" python3 scripts/prewarm_kernels.py --workers 14
phase tests "${TESTS_S:-40}" python3 -m pytest -q -x -p no:cacheprovider tests/gpu/test_kernels_decode_gpu.py
phase decode "${DECODE_S:-110}" python3 scripts/bench_decode_gemm.py --commit "$COMMIT" --rep-ms 3 \
  --budget-s $(( ${DECODE_S:-110} - 15 ))
phase gemm "${GEMM_S:-130}" python3 scripts/bench_gemm.py --commit "$COMMIT" --compare-before \
  --tune-rep-ms 8 --skip-budgets --budget-s $(( ${GEMM_S:-130} - 20 ))
phase fused "${FUSED_S:-80}" python3 scripts/tune_fused_gpu.py --no-check-shapes \
  --budget-s $(( ${FUSED_S:-80} - 25 ))
