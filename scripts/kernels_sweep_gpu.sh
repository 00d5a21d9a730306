#!/usr/bin/env bash
# Every GEMM-kernel measurement of one GPU lease, in one command (JSON and logs under $OUT),
# inside a stage cap of KERNELS_S seconds (default 240):
#   prewarm  the tuning space compiled ahead in parallel processes (Triton's disk cache);
#   gemm     bench_gemm.py's chunk and full shapes vs cuBLAS, small first;
#   fused    tune_fused_gpu.py's catalog shapes, small and large alternately (both bands of
#            the targets: below and above ~0.3 ms): the fused GEMM, its tile tuned, and the
#            overlap case (fused_overlap) against per_chunk;
#   decode   decode GEMMs (bench_decode_gemm.py): the tuner's pick, the fastest persistent
#            tile and the fastest swap-AB tile vs cuBLAS, a spread of M first;
#   tests    the split tail, the fused kernel's host descriptors, grouped chunks, split
#            tails and ready runs (test_kernels_gpu.py)
#            and test_kernels_decode_gpu.py (split-K and swap-AB tiles) in bf16, and the
#            clocks the benchmarks time with (test_timing_gpu.py);
#   summary  scripts/kernels_sweep_summary.py: the geomeans of what the JSON holds.
# Every variant is verified against an fp32 reference before it is timed, and every JSON
# carries the environment's fingerprint (ficco.measure.fingerprint).
# PHASES picks and orders them (default: all, in that order). Each phase's cap is its share
# (SHARE_<phase>, default prewarm 12 gemm 40 fused 28 decode 14 tests 6) of the time left
# before the stage's end (KERNELS_S less MARGIN_S, default 8), so time a phase leaves unused
# goes to the phases after it; a phase whose cap is too short to measure anything (fused 30 s,
# gemm and decode 20 s, else 5 s) is skipped and leaves it to the next; a phase's own budget (--budget-s) is its cap less the seconds
# its start-up and last save take. Every script writes its JSON after each shape, so a phase
# cut by its cap still returns what it measured. On one H100, 2026-11-25, at KERNELS_S=250:
# prewarm 26 s, bench_gemm 84 s for all 56 shapes (with do_bench's picks, no longer asked),
# decode 69 s for 155 shapes, fused 37 s for 14 small shapes, GPU tests 26 s.
#   KERNELS_S=240 bash scripts/kernels_sweep_gpu.sh --dry-run   # prints the plan, runs nothing
set -u
cd "$(dirname "$0")/.."
DRY=0
[[ "${1:-}" == "--dry-run" ]] && DRY=1
: "${OUT:=${STAGE_DIR:-}}"
: "${OUT:?set OUT (or STAGE_DIR)}"
export PYTHONUNBUFFERED=1 CUDA_MODULE_LOADING=EAGER
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export TRITON_CACHE_DIR=${TRITON_CACHE_DIR:-/tmp/ficco_triton_cache}
export FICCO_CACHE_DIR=$OUT/cache
PY=${PYTHON:-python3}
KERNELS_S=${KERNELS_S:-240}
MARGIN_S=${MARGIN_S:-8}
PHASES=${PHASES:-prewarm gemm fused decode tests}
COMMIT=${COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
# decode rows in the order to measure: a spread of M first, so a cut run still covers each band
DECODE_M=${DECODE_M:-1 16 64 512 4 128 32 2 8 256}
LOG=$OUT/sweep.log
START=$(date +%s)
END=$(( START + KERNELS_S - MARGIN_S ))
mkdir -p "$OUT" "$FICCO_CACHE_DIR"

share() {  # a phase's share of the time left
  case $1 in
    prewarm) echo "${SHARE_prewarm:-12}" ;;
    gemm) echo "${SHARE_gemm:-40}" ;;
    fused) echo "${SHARE_fused:-28}" ;;
    decode) echo "${SHARE_decode:-14}" ;;
    tests) echo "${SHARE_tests:-6}" ;;
    *) echo 0 ;;
  esac
}
least() {  # the shortest cap worth starting a phase with
  case $1 in
    fused) echo 30 ;;
    gemm | decode) echo 20 ;;
    *) echo 5 ;;
  esac
}
startup() {  # seconds a phase's script spends outside its --budget-s (imports, last save)
  case $1 in
    decode) echo 12 ;;
    gemm) echo 15 ;;
    fused) echo 20 ;;
    *) echo 0 ;;
  esac
}
cap_of() {  # phase, phases after it: its share of the time left now
  local name=$1 rest=$2 total left
  total=$(share "$name")
  for p in $rest; do total=$(( total + $(share "$p") )); done
  left=$(( END - $(date +%s) ))
  (( left < 0 )) && left=0
  echo $(( total > 0 ? left * $(share "$name") / total : 0 ))
}
command_of() {  # phase, cap: the command line
  local budget=$(( $2 - $(startup "$1") ))
  (( budget < 5 )) && budget=5
  case $1 in
    prewarm) echo "$PY scripts/prewarm_kernels.py --workers ${PREWARM_WORKERS:-14}" ;;
    decode) echo "$PY scripts/bench_decode_gemm.py --commit $COMMIT --m $DECODE_M --budget-s $budget" ;;
    gemm) echo "$PY scripts/bench_gemm.py --commit $COMMIT --skip-budgets --budget-s $budget" ;;
    fused) echo "$PY scripts/tune_fused_gpu.py --no-check-shapes --no-robustness --bands --budget-s $budget" ;;
    tests) echo "$PY -m pytest -q -x -p no:cacheprovider -o addopts= tests/gpu/test_kernels_gpu.py::test_split_tail tests/gpu/test_kernels_gpu.py::test_fused_host_descriptors_wait_and_signal tests/gpu/test_kernels_gpu.py::test_fused_grouped_chunks_read_each_chunk_only_after_its_flag tests/gpu/test_kernels_gpu.py::test_fused_split_tail_with_a_late_chunk tests/gpu/test_kernels_gpu.py::test_fused_ready_runs_read_each_chunk_only_after_its_flag tests/gpu/test_kernels_gpu.py::test_fused_ready_runs_give_up_on_a_chunk_that_never_arrives tests/gpu/test_kernels_decode_gpu.py tests/gpu/test_timing_gpu.py" ;;
  esac
}
run_phase() {  # name, cap, command...
  local name=$1 cap=$2
  shift 2
  echo "=== $name (cap ${cap}s) $(date -u +%T)" | tee -a "$LOG"
  timeout --kill-after=3 "$cap" "$@" 2>&1 | tee -a "$LOG" | tail -n 12
  echo "=== $name rc=${PIPESTATUS[0]} $(date -u +%T)" | tee -a "$LOG"
}

if (( DRY )); then
  echo "stage ${KERNELS_S}s (margin ${MARGIN_S}s), phases: $PHASES; caps if each phase runs to its cap:"
  rest=$PHASES
  for name in $PHASES; do
    rest=${rest#*"$name"}
    cap=$(cap_of "$name" "$rest")
    if (( cap < $(least "$name") )); then
      echo "  $name skipped: ${cap}s left for it"
      continue
    fi
    echo "  $name ${cap}s: $(command_of "$name" "$cap")"
    END=$(( END - cap ))
  done
  exit 0
fi

nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,power.limit,temperature.gpu \
  --format=csv 2>&1 | tee -a "$LOG"
echo "stage ${KERNELS_S}s, phases: $PHASES, commit $COMMIT" | tee -a "$LOG"
rest=$PHASES
for name in $PHASES; do
  rest=${rest#*"$name"}
  cap=$(cap_of "$name" "$rest")
  if (( cap < $(least "$name") )); then
    echo "=== $name skipped: ${cap}s left" | tee -a "$LOG"
    continue
  fi
  # shellcheck disable=SC2046
  run_phase "$name" "$cap" $(command_of "$name" "$cap")
done
echo "=== summary $(date -u +%T)" | tee -a "$LOG"
timeout 20 $PY scripts/kernels_sweep_summary.py "$OUT" 2>&1 | tee -a "$LOG"
echo "=== kernels sweep done in $(( $(date +%s) - START ))s of ${KERNELS_S}s" | tee -a "$LOG"
