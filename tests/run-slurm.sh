#!/usr/bin/env bash
# The Slurm integration tests (tests/slurm) on a real cluster; tests/run.sh calls this last.
#   1. a cluster that sbatch already reaches (sinfo answers) is used as it is;
#   2. else the local two-node cluster (slurm/local-cluster.sh) is used if it is up, or started
#      if we may (root, and Slurm installed or apt-get to install it) -- and then always stopped
#      again on the way out, so no daemon is left running;
#   3. else: "SKIPPED slurm tests: <reason>" and exit 0 -- or exit 1 when
#      MPICOLL_REQUIRE_SLURM=1 (.ci/run sets it), as also when the local cluster fails to start.
# Extra arguments go to pytest. MPICOLL_SLURM_SBATCH_ARGS adds options to every sbatch (e.g.
# "-p debug -A project" on a site cluster); the jobs need 2 nodes with 2 tasks each.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1

skip() {
    if [ "${MPICOLL_REQUIRE_SLURM:-0}" = 1 ]; then
        echo "FAILED slurm tests: $1 (MPICOLL_REQUIRE_SLURM=1 requires them)"
        exit 1
    fi
    echo "SKIPPED slurm tests: $1"
    exit 0
}

LOCAL_ENV=${MPICOLL_SLURM_DIR:-/tmp/mpicoll-slurm}/env
if command -v sinfo >/dev/null && timeout 20 sinfo -h >/dev/null 2>&1; then
    echo "== Slurm tests on the cluster sbatch reaches (SLURM_CONF=${SLURM_CONF:-its default})"
elif bash slurm/local-cluster.sh status >/dev/null 2>&1 && [ -r "$LOCAL_ENV" ]; then
    echo "== Slurm tests on the local cluster, which is already up (left up afterwards)"
    # shellcheck disable=SC1090
    source "$LOCAL_ENV"
elif [ "$(id -u)" = 0 ] && { command -v slurmctld >/dev/null || [ -x /usr/sbin/slurmctld ] ||
                             command -v apt-get >/dev/null; }; then
    echo "== starting the local Slurm cluster (slurm/local-cluster.sh up)"
    trap 'echo "== stopping the local Slurm cluster"; bash slurm/local-cluster.sh down' EXIT
    trap 'exit 130' INT TERM
    if ! up=$(bash slurm/local-cluster.sh up); then
        skip "the local Slurm cluster did not start (its messages are above)"
    fi
    eval "$up"
    export SLURM_CONF
else
    skip "no Slurm cluster answers (sinfo), and starting the local one needs root with apt-get"
fi

timeout -k 30 1500 python -m pytest tests/slurm -q -p no:cacheprovider --timeout=900 "$@"
rc=$?
if [ $rc = 5 ]; then
    echo "(no Slurm test selected)"
    rc=0
fi
exit $rc
