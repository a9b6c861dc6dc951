#!/usr/bin/env bash
# Regenerates everything docs/results.md quotes, on the machine it runs on:
#   bash run.sh shell        # (or put .venv/bin on PATH), then:
#   bash docs/make-results.sh
# 1. calibrate alpha/beta/gamma (mpiexec -n 2) -> mpicoll/profiles/default.json
# 2. the all-reduce sweep at N = 2 and 4 (three times each), and at N = 4 with virtual nodes of
#    2 ranks (hierarchical vs flat) -> docs/results/*.json, *.txt, *.png
# 3. mpicoll tune on the N = 2 and 4 sweeps (pooled: median over the three runs)
#    -> mpicoll/profiles/tuning.json (what auto uses)
# 4. the issue's acceptance run with that table: mpiexec -n 4 mpicoll bench -b 8 -e 4M -f 4
# 5. markdown tables -> docs/results/tables.md, and pasted into docs/results.md
# Takes about 10 minutes on 2 cores. Run it on a quiet machine: timings are medians, but a busy
# machine still moves them.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=docs/results
mkdir -p "$OUT"
SWEEP=(-b 8 -e 16M -f 4)

mpiexec -n 2 python -m mpicoll calibrate -o mpicoll/profiles/default.json | tee "$OUT/calibrate.txt"

for n in 2 4; do
    mpiexec -n "$n" python -m mpicoll bench "${SWEEP[@]}" --json "$OUT/allreduce-np$n.json" \
        | tee "$OUT/allreduce-np$n.txt"
    python -m mpicoll plot "$OUT/allreduce-np$n.json" -o "$OUT/allreduce-np$n.png"
    for run in 2 3; do      # two more sweeps, for the decision table only
        mpiexec -n "$n" python -m mpicoll bench "${SWEEP[@]}" --json "$OUT/tune-np$n-$run.json" \
            > /dev/null
    done
done
MPICOLL_RANKS_PER_NODE=2 mpiexec -n 4 python -m mpicoll bench "${SWEEP[@]}" \
    -a ring,recursive_halving,recursive_doubling,hierarchical \
    --json "$OUT/allreduce-np4-2nodes.json" | tee "$OUT/allreduce-np4-2nodes.txt"
python -m mpicoll plot "$OUT/allreduce-np4-2nodes.json" -o "$OUT/allreduce-np4-2nodes.png"

python -m mpicoll tune "$OUT"/allreduce-np[24].json "$OUT"/tune-np*.json \
    -o mpicoll/profiles/tuning.json | tee "$OUT/tune.txt"

mpiexec -n 4 python -m mpicoll bench -b 8 -e 4M -f 4 --json "$OUT/acceptance-np4.json" \
    | tee "$OUT/acceptance-np4.txt"
python -m mpicoll model -N 4 -e 16M | tee "$OUT/model-np4.txt"
python -m mpicoll model -N 64 --ranks-per-node 8 -e 64M | tee "$OUT/model-np64.txt"

python -m mpicoll report "$OUT"/allreduce-np2.json "$OUT"/allreduce-np4.json \
    "$OUT"/allreduce-np4-2nodes.json "$OUT"/acceptance-np4.json > "$OUT/tables.md"
python - "$OUT/acceptance-np4.json" <<'PY' | tee "$OUT/acceptance-check.txt"
import json, sys
res = json.load(open(sys.argv[1]))
rows = [r for r in res["records"] if not r["inplace"]]
worst = 0
for size in sorted({r["size"] for r in rows}):
    own = {r["algorithm"]: r["time_us"] for r in rows if r["size"] == size}
    best = min(t for a, t in own.items() if a not in ("auto", "mpi"))
    ratio = own["auto"] / best
    worst = max(worst, ratio)
    print(f"{size:>9} B: auto ran {next(r['auto_choice'] for r in rows if r['size'] == size and r['algorithm'] == 'auto'):>18}, "
          f"{ratio:.2f}x the best")
print(f"worst auto/best = {worst:.2f}; wrong elements: {sum(r['wrong'] for r in res['records'])}")
PY
# paste each table into docs/results.md, between <!-- table: NAME --> and <!-- end table -->
# (mpicoll report docs/results/NAME.json), and each <!-- file: PATH --> block
python docs/generators/doc_tables.py docs/results.md
