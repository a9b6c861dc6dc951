#!/usr/bin/env bash
# slurm/local/fabric-reproduce.sh -- regenerate docs/fabric.md's measurements on this machine:
# for each link speed, the local cluster on a shaped fabric of 4 nodes, slurm/fabric.sbatch
# (link bytes, then the bench at every layout), the results copied to docs/results/, then
# jobs/fabric_report.py (tables, simulator, plots). Needs root (namespaces, Slurm) and the
# environment of run.sh (python with mpi4py, mpicoll, matplotlib on PATH).
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
    unset MPICOLL_FABRIC
done
python jobs/fabric_report.py --collect "${dirs[@]}"
