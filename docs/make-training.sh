#!/usr/bin/env bash
# Regenerates docs/training.md's measurements: jobs/experiments/train_dp.py at N = 4 and 2 (about 3.5
# minutes each on 2 cores), its output and JSON in docs/results/train_dp-np{4,2}.*, then the
# tables (python docs/generators/doc_tables.py docs/training.md).
#   bash run.sh shell        # (or put .venv/bin on PATH), then:
#   bash docs/make-training.sh
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
OUT=docs/results
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
for n in 4 2; do
    mpiexec -n $n python -m mpi4py jobs/experiments/train_dp.py --steps 300 --repeats 3 --outdir "$TMP" \
        | tee "$OUT/train_dp-np$n.txt"
    cp "$TMP/train_dp.json" "$OUT/train_dp-np$n.json"
done
python docs/generators/doc_tables.py docs/training.md
