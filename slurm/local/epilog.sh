#!/usr/bin/env bash
# epilog.sh -- the local cluster's Slurm Epilog: remove the shared-memory
# segments a job's MPICH ranks leave in /dev/shm when they are killed.
#
# MPICH names its node segment after the PMI key-value space, which under
# `srun --mpi=pmi2` is "<job id>.<step id>":
#     /dev/shm/mpich_shm_<FNV-1a of "8.0" in hex>_<node index>
# A rank that exits normally unlinks it; a rank that is killed (the timeout
# and dead-rank tests do that on purpose) leaves it behind. A later job with
# the same id and step then opens the stale segment instead of creating its
# own, and MPI_Init fails with "MPIDI_POSIX_comm_bootstrap: Out of memory".
# Real sites clean /dev/shm in an epilog for the same reason.
#
# slurmd runs this as root after every job on every node it used, with
# SLURM_JOB_ID set. It must never fail: a failing epilog drains the node.

fnv1a() {   # the 32-bit FNV-1a hash MPICH uses (uthash's HASH_FNV), in hex
    local s=$1 h=2166136261 i c
    for ((i = 0; i < ${#s}; i++)); do
        printf -v c '%d' "'${s:i:1}"
        h=$(((h ^ c) * 16777619 & 0xffffffff))
    done
    printf '%x' "$h"
}

if [[ ${SLURM_JOB_ID:-} =~ ^[0-9]+$ ]]; then
    for ((step = 0; step < 64; step++)); do
        h=$(fnv1a "$SLURM_JOB_ID.$step")
        rm -f /dev/shm/mpich_shm_"$h"_* /dev/shm/mpich_vci_"$h"_* 2>/dev/null
    done
fi
exit 0
