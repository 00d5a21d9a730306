#!/usr/bin/env bash
# Every one-GPU check and benchmark of a lease in one command: each stage runs under its own
# time cap, writes into its own folder, and comes back as $OUT/<stage>.tgz (the device tool
# returns at most 8 files), so a stage cut short by its cap still returns what it wrote.
#
# usage: STAGES="lane fp8gemm kernels" scripts/one_gpu_checks.sh
#   lane     tests/gpu's multi-rank tests in the one-GPU lane (ranks share this GPU):
#            emb_a2a and fp8 schedules, verification only                  (cap LANE_S)
#   fp8gemm  scripts/bench_fp8_gemm.py: ficco's Triton FP8 GEMMs vs torch._scaled_mm,
#            every variant verified first; then tests/gpu/test_kernels_scaled_gpu.py on
#            the kernels it compiled (the last FP8_TESTS_S of the cap)           (cap FP8GEMM_S)
#   kernels  scripts/kernels_sweep_gpu.sh: bf16 GEMM kernels vs cuBLAS          (cap KERNELS_S)
# Caps are seconds; the defaults fit one 600-second call.
set -u
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
: "${OUT:?set OUT}"
STAGES=${STAGES:-lane fp8gemm kernels}
WORK=$(mktemp -d /tmp/one_gpu_checks.XXXX)
export PYTHONUNBUFFERED=1 CUDA_MODULE_LOADING=EAGER
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export TRITON_CACHE_DIR=${TRITON_CACHE_DIR:-/tmp/ficco_triton_cache}
export COMMIT=${COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
LOG=$OUT/driver.log
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,power.limit,temperature.gpu \
  --format=csv 2>&1 | tee -a "$LOG"
stage() {  # stage NAME CAP CMD...: run in $WORK/NAME (exported as STAGE_DIR), pack it into $OUT
  local name=$1 cap=$2
  shift 2
  export STAGE_DIR=$WORK/$name
  mkdir -p "$STAGE_DIR"
  echo "=== $name (cap ${cap}s) $(date -u +%T)" | tee -a "$LOG"
  timeout --kill-after=10 "$cap" "$@" > "$STAGE_DIR/stage.log" 2>&1
  echo "=== $name rc=$? $(date -u +%T)" | tee -a "$LOG"
  tail -n 15 "$STAGE_DIR/stage.log" | tee -a "$LOG"
  tar czf "$OUT/$name.tgz" -C "$WORK" "$name"
}
has() { [[ " $STAGES " == *" $1 "* ]]; }
has lane && stage lane "${LANE_S:-140}" env FICCO_GEMM_AUTOTUNE=0 FICCO_SHARED_WORLDS="${SHARED_WORLDS:-2 3}" \
  python3 -m pytest -q -rs -p no:cacheprovider -o addopts= ${LANE_TESTS:-tests/gpu/test_embedding_lane.py tests/gpu/test_fp8_gpu.py tests/gpu/test_fp8_lane.py} \
  --junitxml "$WORK/lane/junit.xml"
FP8GEMM_S=${FP8GEMM_S:-210} FP8_TESTS_S=${FP8_TESTS_S:-45} KERNELS_S=${KERNELS_S:-220}
has fp8gemm && stage fp8gemm "$FP8GEMM_S" bash -c "
  timeout $(( FP8GEMM_S - FP8_TESTS_S )) python3 scripts/bench_fp8_gemm.py --out '$WORK/fp8gemm' \
    --budget-s $(( FP8GEMM_S - FP8_TESTS_S - 15 ))
  echo \"bench rc=\$?\"
  python3 -m pytest -q -rs -p no:cacheprovider -o addopts= tests/gpu/test_kernels_scaled_gpu.py \
    --junitxml '$WORK/fp8gemm/junit.xml'"
has kernels && stage kernels "$KERNELS_S" env OUT="$WORK/kernels" KERNELS_S="$KERNELS_S" \
  bash scripts/kernels_sweep_gpu.sh
exit 0
