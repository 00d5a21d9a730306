#!/usr/bin/env bash
# Profile one machine kind end to end, on W GPUs of one host:
#   bench   the overlap benchmark (ficco's schedules vs serial, async-TP, ideal) -> bench_overlap.json
#   sweep   the workload catalog's AG+GEMM and GEMM+RS layers, exhaustive      -> store/
#   report  the store's plots and summary                                      -> report/
#   select  the selector, evaluated on held-out models, and its table          -> schedules/MACHINE/
#
# usage: scripts/profile_machine.sh W MACHINE
#   e.g. scripts/profile_machine.sh 2 h200x2      (on nvidia-h200-x2)
#        scripts/profile_machine.sh 8 h200x8      (on nvidia-h200-x8)
# Environment:
#   STAGES="bench sweep report select"  which stages run (the last two need no GPU)
#   SWEEP_TIME_LIMIT=SECONDS            start no new sweep problem after this long; rerun the
#                                       same command (with the store carried) to resume
#   TOKENS="256 512 ..."                token counts of the catalog sweep
#   SHAPES=FILE.csv                     sweep these shapes instead (e.g. the wider catalog,
#                                       profiles/h200x2/shapes_wide.csv: 507 W=2 shapes)
#   SWEEP_ROUNDS=20                     timed rounds per sweep candidate, or auto (at least 5,
#                                       then until each median is known to 2%, at most 50)
# Outputs go under $OUT/MACHINE when $OUT is set (a GPU machine that is handed back), else
# under profiles/MACHINE and schedules/MACHINE. The sweep resumes an interrupted store.
set -euo pipefail
W=${1:?usage: $0 W MACHINE}
MACHINE=${2:?usage: $0 W MACHINE}
STAGES=${STAGES:-bench sweep report select}
TOKENS=${TOKENS:-256 512 1024 2048 3072 4096 8192}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
DEST=${OUT:+$OUT/$MACHINE}
PROFILES=${DEST:-profiles/$MACHINE}
TABLES=${DEST:+$DEST/schedules}
TABLES=${TABLES:-schedules/$MACHINE}
mkdir -p "$PROFILES"
export PYTHONUNBUFFERED=1
export FICCO_CACHE_DIR=${FICCO_CACHE_DIR:-$ROOT/.cache}
# where this cache has no entry, the tuning caches shipped in the package for this card
# (schedules/<card>/gemm_tuning.json: ficco.kernels.tuning.shipped_entries) answer
# --force: this script writes the shipped profiles/ and schedules/ that user commands refuse
ficco() { python3 -m ficco.cli "$@"; }
has() { [[ " $STAGES " == *" $1 "* ]]; }

if has bench; then
  echo "== overlap benchmark, W=$W"
  python3 scripts/bench_overlap.py --world "$W" --out "$PROFILES/bench_overlap.json" \
    > "$PROFILES/bench_overlap.log" 2>&1 || echo "bench_overlap exited $? (see its log)"
  tail -n 60 "$PROFILES/bench_overlap.log"
fi

if has sweep; then
  echo "== exhaustive sweep of the catalog, W=$W"
  # the catalog's AG+GEMM / GEMM+RS layers at these token counts (154 distinct shapes at
  # W = 2). The space: both transports, cuBLAS
  # GEMMs (tuning a Triton GEMM for every chunk shape of every problem would cost more than
  # the sweep), 2/4/8 chunks, both priorities and compute granularities, both splits.
  SHAPES=${SHAPES:-$PROFILES/shapes.csv}
  [ -f "$SHAPES" ] || SHAPES=profiles/$MACHINE/shapes.csv
  if [ ! -f "$SHAPES" ]; then
    # shellcheck disable=SC2046
    ficco workloads --force --world "$W" $(for t in $TOKENS; do echo -t "$t"; done) --csv "$SHAPES" > /dev/null
  fi
  ficco sweep --force --shapes "$SHAPES" --world "$W" --store "$PROFILES/store" --backend cuda \
    --strategy exhaustive --gemm cublas --transport ce --transport nccl \
    --chunks 2 --chunks 4 --chunks 8 --rounds "${SWEEP_ROUNDS:-20}" --timeout 90 \
    ${SWEEP_TIME_LIMIT:+--time-limit "$SWEEP_TIME_LIMIT"} || echo "sweep exited $?"
fi

if has report; then
  echo "== report"
  ficco report --force --store "$PROFILES/store" --out "$PROFILES/report" --json
fi

if has select; then
  echo "== selector"
  mkdir -p "$TABLES"
  ficco evaluate --force --store "$PROFILES/store" --holdout-by model --machine "$MACHINE" \
    --out "$PROFILES/evaluate.json"
  ficco train --force --store "$PROFILES/store" --out "$TABLES" --machine "$MACHINE"
fi
