#!/usr/bin/env bash
# The GPU checks and benchmarks that need W GPUs of one host, one stage per device call (each
# stays under 10 minutes). Results go under $OUT (or ./gpu_checks when $OUT is unset).
#
# usage: STAGES="tests overlap block allreduce moe fused timeline" scripts/gpu_checks.sh W
#   tests      python -m pytest tests/gpu (CUDA executor, kernels, ops on W GPUs)
#   overlap    scripts/bench_overlap.py: every schedule vs serial, async-TP, ideal -> bench_overlap.json
#   block      scripts/bench_op_overhead.py: the host time an op call adds      -> bench_op_overhead.json
#              scripts/bench_block.py: the TP/SP transformer block with ficco ops -> bench_block.json
#   allreduce  scripts/bench_allreduce.py: (a) every all-reduce transport       -> bench_allreduce.json
#              (b) gemm_ar layer schedules, one model, M 1/64/2048 (the full suite: --parts b
#              --models M --tokens T per call)                      -> bench_allreduce_layers.json
#              scripts/bench_decode.py: a TP decode step with matmul_all_reduce -> bench_decode.json
#   moe        scripts/bench_moe.py: the all-to-all alone, then the MoE expert layers (a first
#              slice; the rest: --models M --tokens T per call)       -> bench_moe*.json
#   fused      scripts/tune_fused_gpu.py (one GPU)
#   timeline   scripts/timeline.py: one shape per pattern, per-task GPU spans -> timeline.{json,png}
#   shared     the one-GPU lane (not in the default STAGES; W is ignored): W = 2, 4 (and 8)
#              ranks that share one GPU (ficco.execute.cuda_shared, verification only):
#              tests/gpu in that lane, then scripts/gpu_shared.py (every ce/seg/nccl schedule
#              of every pattern, captured where the real backend captures, and a sweep with a
#              hang, an OOM, a killed rank and a corrupted chunk)  -> gpu_shared.json
set -uo pipefail
W=${1:?usage: $0 W}
STAGES=${STAGES:-tests overlap block allreduce moe fused timeline}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
DEST=${OUT:-$ROOT/gpu_checks}
mkdir -p "$DEST"
export PYTHONUNBUFFERED=1
export FICCO_CACHE_DIR=${FICCO_CACHE_DIR:-$ROOT/.cache}
# where this cache has no entry, the tuning caches shipped in the package for this card
# (schedules/<card>/gemm_tuning.json: ficco.kernels.tuning.shipped_entries) answer
has() { [[ " $STAGES " == *" $1 "* ]]; }
run() {  # run NAME TIMEOUT CMD...: log to $DEST/NAME.log, say how it ended, go on
  local name=$1 limit=$2; shift 2
  echo "== $name: $*"
  timeout "$limit" "$@" > "$DEST/$name.log" 2>&1
  echo "== $name exited $?"; tail -n 25 "$DEST/$name.log"
}
has tests && run tests 560 python3 -m pytest -q -rs tests/gpu
has overlap && run bench_overlap 560 python3 scripts/bench_overlap.py --world "$W" --out "$DEST/bench_overlap.json"
if has block; then
  run bench_op_overhead 120 python3 scripts/bench_op_overhead.py --world "$W" --out "$DEST/bench_op_overhead.json"
  run bench_block 440 python3 scripts/bench_block.py --world "$W" --out "$DEST/bench_block.json"
fi
if has allreduce; then
  run bench_allreduce 400 python3 scripts/bench_allreduce.py --world "$W" --parts a --out "$DEST/bench_allreduce.json"
  run bench_allreduce_layers 400 python3 scripts/bench_allreduce.py --world "$W" --parts b --quick --out "$DEST/bench_allreduce_layers.json"
  run bench_decode 150 python3 scripts/bench_decode.py --world "$W" --out "$DEST/bench_decode.json"
fi
if has moe; then
  run bench_moe_transfers 250 python3 scripts/bench_moe.py --world "$W" --part transfers --out "$DEST/bench_moe_transfers.json"
  run bench_moe 300 python3 scripts/bench_moe.py --world "$W" --models mixtral-8x7b --out "$DEST/bench_moe.json"
fi
if has fused; then
  run fused_single_gpu 400 python3 scripts/tune_fused_gpu.py
fi
if has shared; then
  # timings mean nothing here: untuned Triton configurations, no tuning on the shared GPU
  run shared_tests "${SHARED_TESTS_LIMIT:-330}" env FICCO_GEMM_AUTOTUNE=0 FICCO_SHARED_WORLDS="${SHARED_WORLDS:-2 4}" \
    python3 -m pytest -q -rs tests/gpu --junitxml "$DEST/shared_tests.xml"
  run gpu_shared "${SHARED_LIMIT:-240}" env FICCO_GEMM_AUTOTUNE=0 python3 scripts/gpu_shared.py \
    --out "$DEST" --worlds ${SHARED_MATRIX_WORLDS:-2 4 8} --junit "$DEST/shared_tests.xml" \
    --budget-s "${SHARED_BUDGET_S:-150}"
fi
has timeline && run timeline 400 python3 scripts/timeline.py --world "$W" --out "$DEST"
exit 0
