#!/usr/bin/env bash
# The Slurm integration tests (tests/slurm) on a real Slurm cluster; tests/run.sh calls this last.
# By default ONLY the local two-node cluster of slurm/local-cluster.sh, on this machine:
#   1. if it is up already, it is used (and left up);
#   2. else, as root with Slurm installed, it is started -- and always stopped again on the way
#      out, so no daemon is left running. Installing Slurm (apt-get, as root) is done only when
#      MPICOLL_REQUIRE_SLURM=1 asks for the tests to run whatever it takes (.ci/run sets it);
#   3. else: "SKIPPED slurm tests: <reason>" and exit 0 -- or exit 1 when
#      MPICOLL_REQUIRE_SLURM=1, as also when the local cluster fails to start.
# A cluster the tests did not start -- e.g. the site's, from a login node -- is never used,
# unless MPICOLL_SLURM_CLUSTER=reachable asks for the cluster that `sinfo` already reaches (then
# nothing is started or installed). MPICOLL_SKIP_SLURM=1 skips the Slurm tests.
# When it started the local cluster itself, it then restarts it on a shaped fabric (each node in
# its own network namespace, links capped at 1 Gbit/s: `local-cluster.sh up --fabric
# slurm/local/fabric-1g.json --nodes 2`, docs/fabric.md) and runs tests/slurm/test_fabric.py
# there; where network namespaces can't be made, that test is skipped with the reason.
# A cluster that is already up runs test_fabric.py
# only if it is a fabric (its env file sets MPICOLL_FABRIC).
# Extra arguments go to pytest. MPICOLL_SLURM_SBATCH_ARGS adds options to every sbatch (e.g.
# "-p debug -A project" on a site cluster); the jobs need 2 nodes with 2 tasks each.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1

skip() {
    if [ "${MPICOLL_REQUIRE_SLURM:-0}" = 1 ]; then
        echo "FAILED slurm tests: $* (MPICOLL_REQUIRE_SLURM=1 requires them)"
        exit 1
    fi
    echo "SKIPPED slurm tests: $*"
    exit 0
}

have_slurm() { command -v slurmctld >/dev/null || [ -x /usr/sbin/slurmctld ]; }

if [ "${MPICOLL_SKIP_SLURM:-0}" = 1 ]; then
    skip "MPICOLL_SKIP_SLURM=1"
fi

started=0
case "${MPICOLL_SLURM_CLUSTER:-local}" in
reachable)
    unset MPICOLL_FABRIC
    if command -v sinfo >/dev/null && timeout 20 sinfo -h >/dev/null 2>&1; then
        echo "== Slurm tests on the cluster sbatch reaches (MPICOLL_SLURM_CLUSTER=reachable;" \
             "SLURM_CONF=${SLURM_CONF:-its default})"
    else
        skip "MPICOLL_SLURM_CLUSTER=reachable, but no Slurm cluster answers (sinfo)"
    fi
    ;;
local)
    LOCAL_ENV=${MPICOLL_SLURM_DIR:-/tmp/mpicoll-slurm}/env
    if bash slurm/local-cluster.sh status >/dev/null 2>&1 && [ -r "$LOCAL_ENV" ]; then
        echo "== Slurm tests on the local cluster, which is already up (left up afterwards)"
        unset MPICOLL_FABRIC
        # shellcheck disable=SC1090
        source "$LOCAL_ENV"
    elif [ "$(id -u)" != 0 ]; then
        skip "the local Slurm cluster is not up, and starting it needs root (a cluster the" \
             "tests did not start is used only with MPICOLL_SLURM_CLUSTER=reachable)"
    elif ! have_slurm && [ "${MPICOLL_REQUIRE_SLURM:-0}" != 1 ]; then
        skip "Slurm is not installed (MPICOLL_REQUIRE_SLURM=1 lets slurm/local-cluster.sh" \
             "install it with apt-get)"
    elif ! have_slurm && ! command -v apt-get >/dev/null; then
        skip "Slurm is not installed, and there is no apt-get to install it"
    else
        echo "== starting the local Slurm cluster (slurm/local-cluster.sh up)"
        # sbatch --wait polls every 8 s (MinJobAge 16; 2, 10, 42, 74 ... s with the default
        # 300): the stage ends within 8 s of its last job, not up to 32 s after. The array
        # test reads each task's own log, not only sbatch's exit code (local/slurm.conf.in)
        export MPICOLL_SLURM_MIN_JOB_AGE=${MPICOLL_SLURM_MIN_JOB_AGE:-16}
        trap 'echo "== stopping the local Slurm cluster"; bash slurm/local-cluster.sh down' EXIT
        trap 'exit 130' INT TERM
        if ! up=$(bash slurm/local-cluster.sh up); then
            skip "the local Slurm cluster did not start (its messages are above)"
        fi
        unset MPICOLL_FABRIC
        eval "$up"
        started=1
    fi
    export SLURM_CONF      # the local cluster's: sbatch, sinfo, srun reach it and nothing else
    ;;
*)
    echo "MPICOLL_SLURM_CLUSTER must be 'local' or 'reachable', got '$MPICOLL_SLURM_CLUSTER'" >&2
    exit 2
    ;;
esac

timeout -k 30 1500 python -m pytest tests/slurm -q -p no:cacheprovider --timeout=900 "$@"
rc=$?
if [ $rc = 5 ]; then
    echo "(no Slurm test selected)"
    rc=0
fi

# The shaped fabric: the same cluster again, each node in its own network namespace.
if [ $started = 1 ]; then
    echo "== restarting the local cluster on a shaped fabric" \
         "(up --fabric slurm/local/fabric-1g.json --nodes 2)"
    bash slurm/local-cluster.sh down
    if ! up=$(bash slurm/local-cluster.sh up --fabric slurm/local/fabric-1g.json --nodes 2); then
        echo "FAILED slurm fabric test: the cluster did not start on a shaped fabric" \
             "(its messages are above)"
        exit 1
    fi
    eval "$up"
    if [ -z "${MPICOLL_FABRIC:-}" ]; then
        echo "SKIPPED slurm fabric test: no network namespaces on this machine (the line above" \
             "says why)"
    else
        timeout -k 30 600 python -m pytest tests/slurm/test_fabric.py -q -p no:cacheprovider \
            --timeout=300 "$@"
        frc=$?
        if [ $frc = 5 ]; then
            echo "(no Slurm fabric test selected)"
        elif [ $frc != 0 ]; then
            rc=$frc
        fi
    fi
fi
exit $rc
