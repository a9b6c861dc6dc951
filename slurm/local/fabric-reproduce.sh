#!/usr/bin/env bash
# slurm/local/fabric-reproduce.sh -- regenerate docs/fabric.md's measurements on this machine:
# for each link speed, the local cluster on a shaped fabric of 4 nodes, slurm/fabric.sbatch
# (link bytes, then the bench at every layout), the results copied to docs/results/, then
# docs/generators/fabric_report.py (tables, simulator, plots). At 1g, after the sweep, it writes the
# fabric's decision table (mpicoll tune on the new sweep: slurm/local/tuning-fabric-1g.json; not
# --with-mpi, see docs/fabric.md) and runs the bench once more with MPICOLL_TUNING set
# (docs/results/fabric-tuned-*.json: auto with that table; MPICOLL_REPRODUCE_TUNED=0 skips
# it). Needs root (namespaces, Slurm) and the environment of run.sh (python with mpi4py,
# mpicoll, matplotlib on PATH).
#
#   bash slurm/local/fabric-reproduce.sh [SPEEDS [LAYOUTS]]
#   bash slurm/local/fabric-reproduce.sh              # "1g 10g", "4x2 4x2c 2x1 4x1 2x2"
#   bash slurm/local/fabric-reproduce.sh 1g "4x2"
#
# It stops a local cluster that is up (and leaves none running). On this 2-core machine one
# speed takes about 10-20 minutes, more when the machine is busy.
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
speeds=${1:-1g 10g}
layouts=${2:-4x2 4x2c 2x1 4x1 2x2}
work=$root/results/fabric-reproduce
mkdir -p "$work"
trap 'bash slurm/local-cluster.sh down >/dev/null 2>&1 || true' EXIT
dirs=()
tuned=()
for speed in $speeds; do
    echo "== fabric $speed: $layouts ($(date +%H:%M:%S))"
    bash slurm/local-cluster.sh down >/dev/null 2>&1 || true
    eval "$(bash slurm/local-cluster.sh up --fabric "slurm/local/fabric-$speed.json" --nodes 4)"
    if [[ -z ${MPICOLL_FABRIC:-} ]]; then
        echo "no shaped fabric on this machine (see above): nothing to measure" >&2
        exit 1
    fi
    id=$(cd "$work" && sbatch --parsable --wait "$root/slurm/fabric.sbatch" all \
        --layouts "$layouts") || { echo "the job failed: $work" >&2; exit 1; }
    dirs+=("$work/results/mpicoll-fabric-$id")
    if [[ $speed == 1g && ${MPICOLL_REPRODUCE_TUNED:-1} == 1 ]]; then
        # auto with the fabric's own decision table: `mpicoll tune` on this sweep, then the
        # same bench again with MPICOLL_TUNING
        flat=$(for l in $layouts; do [[ $l == *c ]] || echo "$l"; done | xargs)
        python -m mpicoll tune "$work/results/mpicoll-fabric-$id"/fabric-bench-veth-1g-*x?.json \
            -o slurm/local/tuning-fabric-1g.json
        tid=$(cd "$work" && MPICOLL_TUNING=$root/slurm/local/tuning-fabric-1g.json \
            sbatch --parsable --wait "$root/slurm/fabric.sbatch" bench --layouts "$flat") ||
            { echo "the tuned job failed: $work" >&2; exit 1; }
        tuned=("$work/results/mpicoll-fabric-$tid")
    fi
    unset MPICOLL_FABRIC
done
python docs/generators/fabric_report.py --collect "${dirs[@]}" ${tuned:+--collect-tuned "${tuned[@]}"}
