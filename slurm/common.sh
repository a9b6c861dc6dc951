# shellcheck shell=bash
# slurm/common.sh -- sourced by every slurm/*.sbatch script (never submitted itself).
#
# It picks the job's Python and launcher, makes the job's results directory and says so in the
# log, then offers two functions to the script:
#
#   mpicoll_launch [-n N] CMD ARGS...   run CMD as an MPI job on N ranks (default: every task
#                                       of the allocation)
#   mpicoll_job [-n N] JOB.py ARGS...   run JOB.py (a path such as jobs/experiments/X.py) that way, under `python -m mpi4py`
#                                       (a rank that raises aborts the whole job), with
#                                       --outdir $RESULTS
#
# and the variables MPICOLL_ROOT (the checkout: jobs/, tests/), PYTHON, RESULTS, NTASKS, NNODES.
#
# Settings (environment variables of the submitting shell, which sbatch exports to the job by
# default; all optional):
#   MPICOLL_VENV      a virtual environment to use: its bin/ goes first on PATH (relative paths
#                     are taken from the submit directory)
#   MPICOLL_PYTHON    the interpreter (default: MPICOLL_VENV's, else `python` on PATH, else
#                     python3). It must import mpi4py and mpicoll.
#   MPICOLL_LAUNCHER  srun (default): Slurm starts the ranks and wires them up through PMI;
#                     mpiexec: the MPI library's own launcher, started inside the allocation
#                     (MPICH's Hydra and Open MPI's mpirun both read the Slurm allocation)
#   MPICOLL_PMI       the srun --mpi= plugin: pmi2 (MPICH, Intel MPI, MVAPICH), pmix (Open MPI,
#                     and MPICH builds with PMIx), none, ... Default: $SLURM_MPI_TYPE if set,
#                     else pmix when mpi4py runs on Open MPI, else pmi2. `srun --mpi=list` shows
#                     what the site's Slurm offers.
#   MPICOLL_LAUNCHER_ARGS  extra arguments for srun / mpiexec (e.g. "--cpu-bind=cores")
#   MPICOLL_RESULTS   where per-job results directories go (default: results/ under the submit
#                     directory). This job writes to $MPICOLL_RESULTS/<job name>-<job id>, array
#                     tasks to $MPICOLL_RESULTS/<job name>-<array job id>_<index>.
# Outside Slurm (`bash slurm/bench.sbatch`, for a quick check) the launcher is mpiexec on
# MPICOLL_NP ranks (default 4).

_mpicoll_die() { echo "mpicoll job: ERROR: $*" >&2; exit 2; }

MPICOLL_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
export MPICOLL_ROOT

# -- Python: the submitting shell's (sbatch exports PATH), or the one named -------------------
if [[ -n ${MPICOLL_VENV:-} ]]; then
    [[ -x $MPICOLL_VENV/bin/python ]] || _mpicoll_die "MPICOLL_VENV=$MPICOLL_VENV has no bin/python"
    MPICOLL_VENV=$(cd "$MPICOLL_VENV" && pwd)
    export VIRTUAL_ENV=$MPICOLL_VENV PATH=$MPICOLL_VENV/bin:$PATH
fi
if [[ -n ${MPICOLL_PYTHON:-} ]]; then
    PYTHON=$(command -v "$MPICOLL_PYTHON") ||
        _mpicoll_die "MPICOLL_PYTHON=$MPICOLL_PYTHON not found"
    # Its bin/ first, so that the fallback launcher is the mpiexec installed next to it.
    PATH=$(dirname "$PYTHON"):$PATH
    export PATH
else
    PYTHON=$(command -v python || command -v python3) || _mpicoll_die "no python on PATH"
fi
if ! MPI_LIBRARY=$("$PYTHON" -c '
import mpi4py
mpi4py.rc.initialize = False          # MPI_Get_library_version needs no MPI_Init
from mpi4py import MPI
import mpicoll
print(MPI.Get_library_version().splitlines()[0].strip())' 2>&1); then
    echo "$MPI_LIBRARY" >&2
    _mpicoll_die "$PYTHON cannot import mpi4py and mpicoll. Submit from a shell where the
    environment is active (sbatch exports it), or set MPICOLL_VENV or MPICOLL_PYTHON."
fi

# -- Allocation and launcher ------------------------------------------------------------------
if [[ -n ${SLURM_JOB_ID:-} ]]; then
    NTASKS=${SLURM_NTASKS:-1}
    NNODES=${SLURM_JOB_NUM_NODES:-${SLURM_NNODES:-1}}
    LAUNCHER=${MPICOLL_LAUNCHER:-srun}
else
    NTASKS=${MPICOLL_NP:-4}
    NNODES=1
    LAUNCHER=${MPICOLL_LAUNCHER:-mpiexec}
fi
case $LAUNCHER in
srun)
    [[ -n ${SLURM_JOB_ID:-} ]] || _mpicoll_die "MPICOLL_LAUNCHER=srun needs a Slurm job"
    if [[ -z ${MPICOLL_PMI:-} ]]; then
        case ${SLURM_MPI_TYPE:-} in
        "") [[ $MPI_LIBRARY == *"Open MPI"* ]] && MPICOLL_PMI=pmix || MPICOLL_PMI=pmi2 ;;
        *) MPICOLL_PMI=$SLURM_MPI_TYPE ;;
        esac
    fi
    # A missing plugin would not fail: every rank would start as a singleton of one rank.
    if ! srun --mpi=list 2>&1 | grep -qw -- "$MPICOLL_PMI"; then
        srun --mpi=list >&2 || true
        _mpicoll_die "this Slurm has no '$MPICOLL_PMI' MPI plugin; set MPICOLL_PMI to one above,
    or MPICOLL_LAUNCHER=mpiexec to start the ranks with the MPI library's own launcher"
    fi
    LAUNCH_DESC="srun --mpi=$MPICOLL_PMI"
    # srun of Slurm >= 22.05 no longer inherits --cpus-per-task from the batch allocation.
    if [[ -n ${SLURM_CPUS_PER_TASK:-} ]]; then export SRUN_CPUS_PER_TASK=$SLURM_CPUS_PER_TASK; fi
    ;;
mpiexec)
    command -v mpiexec >/dev/null || _mpicoll_die "MPICOLL_LAUNCHER=mpiexec but no mpiexec on PATH"
    LAUNCH_DESC="$(command -v mpiexec)"
    ;;
*) _mpicoll_die "MPICOLL_LAUNCHER must be srun or mpiexec, not '$LAUNCHER'" ;;
esac
# One thread per rank unless the job asks for more (--cpus-per-task).
export OMP_NUM_THREADS=${SLURM_CPUS_PER_TASK:-1} NUMBA_NUM_THREADS=${SLURM_CPUS_PER_TASK:-1}

# -- Results directory ------------------------------------------------------------------------
JOB_NAME=${SLURM_JOB_NAME:-mpicoll-$(basename "$0" .sbatch)}
if [[ -n ${SLURM_ARRAY_JOB_ID:-} ]]; then
    JOB_TAG=${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID}
else
    JOB_TAG=${SLURM_JOB_ID:-local-$(date +%Y%m%d-%H%M%S)-$$}
fi
RESULTS_BASE=${MPICOLL_RESULTS:-results}
[[ $RESULTS_BASE == /* ]] || RESULTS_BASE=${SLURM_SUBMIT_DIR:-$PWD}/$RESULTS_BASE
RESULTS=$RESULTS_BASE/$JOB_NAME-$JOB_TAG
mkdir -p "$RESULTS" || _mpicoll_die "cannot create $RESULTS"
export RESULTS

# What ran where, for whoever reads the results later.
"$PYTHON" - "$RESULTS/job.json" "$JOB_NAME" "$NNODES" "$NTASKS" "$LAUNCH_DESC" "$PYTHON" \
    "$MPI_LIBRARY" <<'EOF'
import json, os, sys, time
path, name, nodes, ntasks, launcher, python, library = sys.argv[1:]
env = os.environ.get
json.dump({"job_id": env("SLURM_JOB_ID"), "array_job_id": env("SLURM_ARRAY_JOB_ID"),
           "array_task_id": env("SLURM_ARRAY_TASK_ID"), "job_name": name,
           "nodelist": env("SLURM_JOB_NODELIST"), "nodes": int(nodes), "ntasks": int(ntasks),
           "tasks_per_node": env("SLURM_TASKS_PER_NODE"), "partition": env("SLURM_JOB_PARTITION"),
           "launcher": launcher, "python": python, "mpi_library": library,
           "mpicoll_root": env("MPICOLL_ROOT"), "submit_dir": env("SLURM_SUBMIT_DIR"),
           "results": env("RESULTS"), "start": time.strftime("%Y-%m-%dT%H:%M:%S%z")},
          open(path, "w"), indent=1)
EOF

echo "== mpicoll job ${SLURM_JOB_ID:-(no Slurm)} '$JOB_NAME': $NTASKS ranks on $NNODES node(s)" \
     "${SLURM_JOB_NODELIST:+($SLURM_JOB_NODELIST)}"
echo "   results:  $RESULTS"
echo "   python:   $PYTHON ($MPI_LIBRARY)"
echo "   launcher: $LAUNCH_DESC"
_mpicoll_exit() {
    local rc=$?
    echo "== mpicoll job ${SLURM_JOB_ID:-} '$JOB_NAME' finished with status $rc;" \
         "results in $RESULTS"
}
trap _mpicoll_exit EXIT

# numba compiles the reduction kernels once, here, before any rank starts: ranks on other nodes
# would otherwise compile at the same time into a shared cache directory. (No MPI_Init in the
# batch step: some MPI libraries do not start singletons there.)
# (`mpicoll.tools.warm`: what a first float32 job runs; any other dtype or op compiles at its
# first use. It never imports MPI.)
"$PYTHON" -c 'import mpi4py; mpi4py.rc.initialize = False; import sys
from mpicoll.tools import warm; sys.exit(warm.main([]))'

mpicoll_launch() {
    local n=$NTASKS per nodes
    if [[ ${1:-} == -n ]]; then n=$2; shift 2; fi
    local cmd=()
    if [[ $LAUNCHER == srun ]]; then
        # Fill nodes in order, as mpiexec does: N ranks on as few nodes as hold them.
        per=$(( (NTASKS + NNODES - 1) / NNODES ))
        nodes=$(( (n + per - 1) / per ))
        (( nodes <= NNODES )) || nodes=$NNODES
        cmd=(srun --mpi="$MPICOLL_PMI" --kill-on-bad-exit=1 -n "$n" -N "$nodes")
        # A step smaller than the allocation would trip over the inherited --ntasks-per-node.
        (( n == NTASKS )) || cmd=(env -u SLURM_NTASKS_PER_NODE "${cmd[@]}")
    else
        cmd=(mpiexec -n "$n")
    fi
    # shellcheck disable=SC2206  # MPICOLL_LAUNCHER_ARGS is a list of words
    cmd+=(${MPICOLL_LAUNCHER_ARGS:-})
    echo "+ ${cmd[*]} $*"
    "${cmd[@]}" "$@"
}

mpicoll_job() {
    local np=()
    if [[ ${1:-} == -n ]]; then np=(-n "$2"); shift 2; fi
    local script=$1
    shift
    mpicoll_launch "${np[@]+"${np[@]}"}" "$PYTHON" -u -m mpi4py "$MPICOLL_ROOT/$script" \
        --outdir "$RESULTS" "$@"
}
