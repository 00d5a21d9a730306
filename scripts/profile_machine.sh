#!/usr/bin/env bash
# Profile one machine kind end to end, on W GPUs of one host:
#   1. the overlap benchmark (ficco's schedules vs serial, async-TP, ideal) -> bench_overlap.json
#   2. a sweep of the workload catalog's AG+GEMM and GEMM+RS layers       -> the profile store
#   3. the store's report (plots + summary)                                -> report/
#   4. the selector, evaluated on held-out models, and its table           -> schedules/MACHINE/
#
# usage: scripts/profile_machine.sh W MACHINE [TRIALS]
#   e.g. scripts/profile_machine.sh 2 h200x2      (on nvidia-h200-x2)
#        scripts/profile_machine.sh 8 h200x8 30   (on nvidia-h200-x8)
# Outputs go under $OUT/MACHINE when $OUT is set (a GPU machine that is handed back), else
# under profiles/MACHINE and schedules/MACHINE. The sweep resumes an interrupted store.
# Needs optuna (carry wheels where it is not installed) and ficco importable from the repo.
set -euo pipefail
W=${1:?usage: $0 W MACHINE [TRIALS]}
MACHINE=${2:?usage: $0 W MACHINE [TRIALS]}
TRIALS=${3:-40}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
DEST=${OUT:+$OUT/$MACHINE}
PROFILES=${DEST:-profiles/$MACHINE}
TABLES=${DEST:+$DEST/schedules}
TABLES=${TABLES:-schedules/$MACHINE}
mkdir -p "$PROFILES" "$TABLES"
export PYTHONUNBUFFERED=1
export FICCO_CACHE_DIR=${FICCO_CACHE_DIR:-$ROOT/.cache}
if [ ! -f "$FICCO_CACHE_DIR/gemm_tuning.json" ] && [ -f profiles/h200/gemm_tuning.json ]; then
  mkdir -p "$FICCO_CACHE_DIR" && cp profiles/h200/gemm_tuning.json "$FICCO_CACHE_DIR/"
fi
ficco() { python3 -m ficco.cli "$@"; }

echo "== 1/4 overlap benchmark, W=$W"
python3 scripts/bench_overlap.py --world "$W" --out "$PROFILES/bench_overlap.json" \
  > "$PROFILES/bench_overlap.log" 2>&1 || echo "bench_overlap exited $? (see its log)"
tail -n 30 "$PROFILES/bench_overlap.log"

echo "== 2/4 sweep of the catalog, W=$W"
# seven token counts: 154 distinct AG+GEMM / GEMM+RS shapes at W = 2 (>= 150); the cuda
# executor verifies these two patterns (the all-to-all ones run on CPU only so far)
ficco workloads --world "$W" -t 512 -t 1024 -t 2048 -t 3072 -t 4096 -t 8192 -t 16384 \
  --csv "$PROFILES/shapes.csv" > /dev/null
python3 - "$PROFILES/shapes.csv" <<'PY'
import csv, sys
rows = [r for r in csv.DictReader(open(sys.argv[1])) if r["pattern"] in ("ag_gemm", "gemm_rs")]
with open(sys.argv[1], "w", newline="") as f:
    w = csv.DictWriter(f, fieldnames=rows[0].keys())
    w.writeheader(); w.writerows(rows)
print(f"{len(rows)} AG+GEMM / GEMM+RS problems")
PY
ficco sweep --shapes "$PROFILES/shapes.csv" --world "$W" --store "$PROFILES/store" \
  --backend cuda --strategy optuna --trials "$TRIALS"

echo "== 3/4 report"
ficco report --store "$PROFILES/store" --out "$PROFILES/report" --json

echo "== 4/4 selector"
ficco evaluate --store "$PROFILES/store" --holdout-by model --json | tee "$PROFILES/evaluate.json"
ficco train --store "$PROFILES/store" --out "$TABLES"
