"""The data-parallel trainer (jobs/experiments/train_dp.py): N = 2 and 4 ranks with per-rank batches B/N,
gradients averaged through Buckets (several buckets, overlapping the backward pass), end 50
steps with the weights of one process on batch B (fp32, within 1e-5 relative), every rank with
the same bits."""

import importlib.util
from pathlib import Path

import pytest
from mpi4py import MPI

from mpicoll.testing import agree

pytestmark = [pytest.mark.mpi, pytest.mark.timeout(600), pytest.mark.rank_counts(1, 2, 4)]
ROOT = Path(__file__).resolve().parents[2]


def trainer():
    spec = importlib.util.spec_from_file_location("train_dp",
                                                  ROOT / "jobs" / "experiments" / "train_dp.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("mode", ["bucketed", "blocking"])
@pytest.mark.parametrize("nranks", [2, 4])
def test_dp_matches_one_process(comm, nranks, mode):
    size, rank = comm.Get_size(), comm.Get_rank()
    if size < nranks:
        pytest.skip(f"needs {nranks} ranks")
    train_dp = trainer()
    groups = size // nranks
    sub = comm.Split(rank // nranks if rank < groups * nranks else MPI.UNDEFINED, rank)
    ok, msg = True, ""
    if sub != MPI.COMM_NULL:
        try:
            setup = dict(steps=50, batch=64, width=48, lr=0.1, bucket_bytes=4 << 10)
            one = train_dp.train(None, **setup)
            dp = train_dp.train(sub, mode=mode, **setup)
            diff = train_dp.relative_difference(dp["params"], one["params"])
            moved = train_dp.relative_difference(train_dp.init_params(48, 1), one["params"])
            bits = sub.allgather(b"".join(p.tobytes() for p in dp["params"]))
            ok = diff < 1e-5 and moved > 1e-2 and all(b == bits[0] for b in bits)
            msg = (f"{nranks} ranks, {mode}: weights differ from one process's by {diff:.2e} "
                   f"(they moved {moved:.2e} from the start); same bits on every rank: "
                   f"{all(b == bits[0] for b in bits)}")
        finally:
            sub.Free()
    agree(comm, ok, msg)
