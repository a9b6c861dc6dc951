#!/usr/bin/env bash
# Regenerates the data docs/performance.md's tables are made from, then the tables:
#   bash run.sh shell        # (or put .venv/bin on PATH), then:
#   bash docs/make-performance.sh              # everything (about 2 hours on 2 cores)
#   bash docs/make-performance.sh tables       # only remake the tables from docs/results/
#   bash docs/make-performance.sh first-call   # only one part: perf, shm-single, roofline,
#                                              # first-call, first-result
# 1. perf: three rounds of the all-reduce sweep at N = 2, 4 (8 B-64 MiB) and 8 (8 B-4 MiB),
#    plain and --persistent -> docs/results/perf-np*.json
# 2. shm-single: shm's single copy against its window copy, three runs each, taking turns
#    -> docs/results/shm-single-{auto,off}-*.json
# 3. roofline: a sweep at N = 2, the STREAM-like probe, the figure -> docs/roofline-np2.png
# 4. first-call: the first all-reduce at N = 4, cold and warm -> docs/results/first-call-np4.txt,
#    and `import mpicoll` and the first call as whole processes at N = 1, 2, 4
#    -> docs/results/first-call.{json,txt}
# 4b. first-result: the warm-up, an unwarmed first call at N = 2, and `bash run.sh bench` in a
#    fresh clone -> docs/results/first-result.txt, docs/results/first-table.txt
# 5. the tables: python docs/generators/doc_tables.py docs/performance.md (tests/unit/test_doc_tables.py
#    fails on a table that differs from its data)
# Tables whose data was never kept are not here: their commands are in the page, to run again.
# Timings move with the machine's load: run it on a quiet machine and say the load.
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
OUT=docs/results
ONLY=" $* "
part() { [[ "$ONLY" == "  " || "$ONLY" == *" $1 "* ]]; }

if part perf; then
    for r in 1 2 3; do
        for n in 2 4; do
            mpiexec -n $n python -m mpicoll bench -b 8 -e 64M -f 4 --json "$OUT/perf-np$n-$r.json"
            mpiexec -n $n python -m mpicoll bench -b 8 -e 64M -f 4 --persistent \
                --json "$OUT/perf-np$n-persistent-$r.json"
        done
        mpiexec -n 8 python -m mpicoll bench -b 8 -e 4M -f 4 --json "$OUT/perf-np8-$r.json"
        mpiexec -n 8 python -m mpicoll bench -b 8 -e 4M -f 4 --persistent \
            --json "$OUT/perf-np8-persistent-$r.json"
    done
fi
if part shm-single; then
    for r in 1 2 3; do
        for mode in auto off; do
            MPICOLL_SHM_SINGLE_COPY=$mode mpiexec -n 2 python -m mpicoll bench -b 16K -e 4M -f 2 \
                -a shm,ring,recursive_halving,mpi --json "$OUT/shm-single-$mode-$r.json"
        done
    done
fi
if part roofline; then
    mpiexec -n 2 python -m mpicoll bench -b 8 -e 64M -f 4 --json "$OUT/roofline-np2.json"
    python jobs/experiments/stream.py --json "$OUT/stream.json"
    python docs/generators/roofline.py "$OUT/roofline-np2.json" "$OUT/stream.json" -o docs/roofline-np2.png
fi
if part first-call; then
    python jobs/experiments/cold_start.py -n 4 --runs 3 --algorithm auto --executors compiled \
        --dtypes float32 | tee "$OUT/first-call-np4.txt"
    python jobs/experiments/first_call.py -N 1 2 4 --runs 3 --json "$OUT/first-call.json" \
        | tee "$OUT/first-call.txt"
fi
if part first-result; then
    python jobs/experiments/first_result.py --runs 3 | tee "$OUT/first-result.txt"
    python jobs/experiments/first_result.py --runs 1 --all | tee "$OUT/first-result-all.txt"
    python jobs/experiments/first_result.py --families | tee "$OUT/first-result-families.txt"
    python jobs/experiments/first_result.py --bench --runs 3 | tee "$OUT/first-table.txt"
fi
python docs/generators/doc_tables.py docs/performance.md
