#!/usr/bin/env bash
# Regenerates docs/labs.md: runs every lab (jobs/labs/lab_*.py) on this machine, records its output,
# JSON and plot in docs/labs/, then fills docs/labs.md's blocks and summary table from them.
#   bash run.sh shell        # (or put .venv/bin on PATH), then:
#   bash docs/make-labs.sh                     # every lab
#   bash docs/make-labs.sh lab_placement       # only the labs named (the others' records stay)
# About 2-4 minutes on 2 cores; at most 4 MPI ranks (lab_bytes, lab_crossover --measure), 2 for
# lab_ladder's MPI rungs.
# The timed parts (lab_ladder, lab_sockets' seconds, lab_crossover's measured line) move with
# the machine's load.
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
OUT=docs/labs
mkdir -p "$OUT"

ONLY=" $* "
lab() {     # lab NAME COMMAND...: run it, keep its output in $OUT/NAME.txt
    local name=$1; shift
    if [[ "$ONLY" != "  " && "$ONLY" != *" $name "* ]]; then return; fi
    echo "== $name: $*"
    "$@" | tee "$OUT/$name.txt"
}

lab lab_ring_trace python jobs/labs/lab_ring_trace.py --json "$OUT/lab_ring_trace.json" \
    --png "$OUT/lab_ring_trace.png"
lab trace_values python -m mpicoll trace ring -N 4 --values
lab lab_bytes mpiexec -n 4 python -m mpi4py jobs/labs/lab_bytes.py --json "$OUT/lab_bytes.json" \
    --png "$OUT/lab_bytes.png"
lab lab_checkpoint python jobs/labs/lab_checkpoint.py --json "$OUT/lab_checkpoint.json" \
    --png "$OUT/lab_checkpoint.png"
lab lab_crossover python jobs/labs/lab_crossover.py --measure --json "$OUT/lab_crossover.json" \
    --png "$OUT/lab_crossover.png"
lab lab_rails python jobs/labs/lab_rails.py --json "$OUT/lab_rails.json" --png "$OUT/lab_rails.png"
lab lab_placement python jobs/labs/lab_placement.py --json "$OUT/lab_placement.json" \
    --png "$OUT/lab_placement.png"
lab lab_straggler python jobs/labs/lab_straggler.py --json "$OUT/lab_straggler.json" \
    --png "$OUT/lab_straggler.png"
lab lab_ladder python jobs/labs/lab_ladder.py --json "$OUT/lab_ladder.json" --png "$OUT/lab_ladder.png"
lab lab_sockets python jobs/labs/lab_sockets.py --world 4 --json "$OUT/lab_sockets.json"

python docs/generators/labs_md.py docs/labs.md "$OUT"
