# Sourced by tests/run.sh and tests/run-torch.sh (not run on its own).
#
# MPICH names a node's shared-memory segment after the launcher's key-value space
# (Hydra: "kvs_<mpiexec pid>_0"; srun: "<job>.<step>"), and a killed rank leaves it in
# /dev/shm. A later mpiexec that gets the same pid (pid_max is often 32768) opens that stale
# segment and MPI_Init fails "Out of memory". Before each stage, clean_stale_shm removes this
# user's MPICH segments that no running process has mapped (the tests kill ranks on purpose,
# and tests/torch's dead_rank.py ends its ranks with os._exit) and that are a minute old at
# least: the PyTorch leg runs beside the Slurm stage, and a job starting there may not have
# mapped the segment it just made.
clean_stale_shm() {
    local mapped f
    mapped=$(cat /proc/[0-9]*/maps 2>/dev/null | grep -o '/dev/shm/mpich_[^ ]*' | sort -u)
    for f in /dev/shm/mpich_shm_* /dev/shm/mpich_vci_*; do
        [ -O "$f" ] || continue
        [ -n "$(find "$f" -maxdepth 0 -mmin +1)" ] || continue
        grep -qxF "$f" <<<"$mapped" || rm -f "$f"
    done
}
