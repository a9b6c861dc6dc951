"""The seeded MLP of ``mpicoll.testing.ddp_train`` trained with DDP under
``mpicoll.torch.elastic.run``; a rank may die. Run by test_jobs.py:

    mpiexec -disable-auto-cleanup -n N python -m mpicoll survive \\
        python tests/torch/elastic_ddp.py OUTDIR [--steps 50] [--kill RANK@STEP] [--spares S]
        [--reproducible]

Each step's global batch is 24 micro-batches of 4 samples, generated from the step's number
(the same at any N); rank r takes its share (``elastic.microbatches``). SGD with momentum, so
the optimizer's state matters. Without ``--reproducible``: one DDP backward over the rank's
micro-batches, DDP averaging (fp32: within 1e-6 of any other N). With it: one backward per
micro-batch under ``no_sync``, ``MicroBatchSum`` (the same bits at any N), on a group with
``Options(reproducible=True)``. A rank named by ``--kill`` (of COMM_WORLD) writes
OUTDIR/killed.rank<r>.json and calls ``os._exit`` at the start of that step. Each survivor that
trained writes OUTDIR/rank<r>.json (the weights' sha256, the rank count at the end, the wall
clock of the first step after each recovery); the lowest writes OUTDIR/weights.pt.
"""

import argparse
import hashlib
import json
import os
import time
from pathlib import Path

import torch
import torch.nn.functional as F

import mpicoll.reproducible
import mpicoll.torch
from mpicoll.torch import elastic

MICRO, COUNT, FEATURES, HIDDEN, CLASSES = 4, 24, 32, 64, 10


def batch_of(step: int):
    gen = torch.Generator().manual_seed(1000 + step)
    x = torch.randn(MICRO * COUNT, FEATURES, generator=gen)
    teacher = torch.randn(FEATURES, CLASSES, generator=torch.Generator().manual_seed(1))
    return x, (x @ teacher).argmax(dim=1)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out", type=Path)
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--kill", action="append", default=[], metavar="RANK@STEP")
    ap.add_argument("--spares", type=int, default=0)
    ap.add_argument("--reproducible", action="store_true")
    args = ap.parse_args()
    from mpi4py import MPI
    world_rank = MPI.COMM_WORLD.Get_rank()
    kills = {tuple(map(int, k.split("@"))) for k in args.kill}
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(FEATURES, HIDDEN), torch.nn.ReLU(),
                                torch.nn.Linear(HIDDEN, HIDDEN), torch.nn.ReLU(),
                                torch.nn.Linear(HIDDEN, CLASSES))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    state = elastic.TorchState(model, optimizer, step=0)
    calls, recovered_at = [], []

    def train(state, comm):
        calls.append(comm.Get_size())
        ddp = elastic.ddp(state.model, bucket_cap_mb=0.01)  # built again on each communicator
        sums = elastic.MicroBatchSum(state.model)
        first = True
        while state.step < args.steps:
            step = state.step
            if (world_rank, step) in kills:
                (args.out / f"killed.rank{world_rank}.json").write_text(
                    json.dumps({"killed_at": time.time(), "step": step}))
                os._exit(1)
            x, y = batch_of(step)
            mine = [torch.as_tensor(i) for i in elastic.microbatches(MICRO * COUNT, MICRO, comm)]
            state.optimizer.zero_grad(set_to_none=True)
            if args.reproducible:
                for idx in mine:
                    with ddp.no_sync():
                        F.cross_entropy(ddp(x[idx]), y[idx]).backward()
                    sums.add()
                sums.reduce(COUNT, comm)
            else:
                idx = torch.cat(mine)
                F.cross_entropy(ddp(x[idx]), y[idx]).backward()
            state.optimizer.step()
            state.step = step + 1
            state.commit()
            if first and len(calls) > 1:
                recovered_at.append(time.time())
            first = False
        return comm

    if args.reproducible:       # warm numba's kernels: a spare that joins sums at once
        mpicoll.reproducible.warmup()
    options = mpicoll.torch.Options(reproducible=args.reproducible)
    comm = elastic.run(train, state, spares=args.spares, options=options)
    died = any(args.out.glob("killed.rank*.json"))
    if comm is not None:
        weights = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
        row = {"world_rank": world_rank, "ranks_end": comm.Get_size(), "calls": calls,
               "sha256": hashlib.sha256(weights.numpy().tobytes()).hexdigest(),
               "recovered_at": recovered_at}
        (args.out / f"rank{world_rank}.json").write_text(json.dumps(row))
        if comm.Get_rank() == 0:
            torch.save(weights, args.out / "weights.pt")
            print(f"weights sha256 {row['sha256']}", flush=True)
    if died:
        os._exit(0)         # MPI_Finalize would wait for the dead rank


if __name__ == "__main__":
    main()
