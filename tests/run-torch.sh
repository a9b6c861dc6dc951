#!/usr/bin/env bash
# The PyTorch leg of `bash run.sh test` (mpicoll.torch, docs/torch.md), in its own environment
# .venv-torch (extras mpich,test,torch: torch 2.13.0's CPU wheel) that run.sh sets up:
#   1. tests/torch/test_backend.py under mpiexec -n 2 and -n 4: every supported collective, the
#      errors, async futures, DDP against Gloo (1e-6) and bit-identical with a fixed algorithm;
#   2. tests/torch/test_jobs.py (serial; launches mpiexec jobs of 2 and 4 ranks): a dead rank
#      named through Work.wait(); one process without a launcher; torchrun refused; MPI
#      without THREAD_MULTIPLE.
# MPICOLL_SKIP_TORCH=1 skips it (run.sh), except under CI=true. Extra arguments go to pytest.
set -uo pipefail
cd "$(dirname "$0")/.."
bin="$PWD/${TORCH_VENV:-.venv-torch}/bin"
export MPIEXEC_TIMEOUT=${MPIEXEC_TIMEOUT:-900}
status=0

source tests/stale-shm.sh     # clean_stale_shm, as tests/run.sh

if [ ! -x "$bin/python" ] || ! "$bin/python" -c 'import torch' 2>/dev/null; then
    echo "no torch environment at $bin: run this through 'bash run.sh test'"
    exit 1
fi
for n in 2 4; do
    clean_stale_shm
    echo "== torch backend tests, mpiexec -n $n"
    PATH="$bin:$PATH" timeout -k 15 600 mpiexec -n "$n" python -m mpi4py -m pytest \
        tests/torch/test_backend.py --with-mpi -x -q --timeout=300 --timeout-method=thread \
        -W ignore::FutureWarning --color=no "$@" || status=1
done
clean_stale_shm
echo "== torch job tests (tests/torch/test_jobs.py: a dead rank, launchers, SERIALIZED MPI)"
PATH="$bin:$PATH" timeout -k 15 900 python -m pytest tests/torch/test_jobs.py -q \
    --color=no "$@" || status=1
clean_stale_shm
echo "torch leg: $([ $status = 0 ] && echo passed || echo FAILED)"
exit $status
