"""``mpicoll.elastic`` for a DDP script: a rank dies, the survivors go on (docs/elastic.md).

    from mpicoll.torch import elastic

    state = elastic.TorchState(model, optimizer, step=0)   # model and optimizer, committed

    def train(state, comm):                  # the default group is "mpicoll" on ``comm``
        ddp = DistributedDataParallel(state.model)          # built again after each death
        while state.step < steps:
            ...                                             # forward, backward, optimizer.step()
            state.step += 1
            state.commit()

    elastic.run(train, state, min_ranks=1, spares=0, options=mpicoll.torch.Options())

``run`` is ``mpicoll.elastic.run`` with torch around it: before each call of ``train`` the
default process group is ``"mpicoll"`` on the training communicator (``destroy_process_group``,
then ``init_process_group`` on the survivors', or the spare-filled, communicator with a new
store), and a ``RuntimeError`` whose cause is mpicoll's ``ProcessFailed`` -- what DDP and
``Work.wait()`` raise when a rank dies -- is that ``ProcessFailed`` again, so the survivors
shrink, agree on the last commit, restore it (the model's ``state_dict`` in place, the
optimizer's through ``load_state_dict``) and call ``train`` again, which builds DDP afresh.

``MicroBatchSum``: the same bits at any rank count. Each micro-batch's gradient (backward under
``ddp.no_sync()``) is kept as a row; ``reduce`` sums the rows exactly
(``mpicoll.reproducible.sum``), all-reduces the sums with ``reproducible=True`` and writes the
mean into the parameters' ``.grad``. DDP's own bucket all-reduce cannot give those bits, even
with ``Options(reproducible=True)``: a rank's bucket holds the float sum of *its* micro-batches,
rounded already, and which micro-batches a rank holds depends on N.
"""

from __future__ import annotations

import gc
from datetime import timedelta

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

import mpicoll.api as api
from mpicoll import elastic, reproducible
from mpicoll.errors import ProcessFailed

from . import backend
from .backend import NAME, Options
from .rendezvous import store_from_mpi

__all__ = ["TorchState", "MicroBatchSum", "ddp", "run", "init_group", "microbatches"]

microbatches = elastic.microbatches


class TorchState(elastic.State):
    """An ``elastic.State`` of a model (its ``state_dict``: the parameters' and buffers' own
    memory, restored in place) and an optimizer (its ``state_dict``, deep-copied at each commit
    and loaded back after a recovery), and plain values (``step=0``...). ``state.model`` and
    ``state.optimizer`` are the objects."""

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, **values):
        super().__init__(weights=model.state_dict(), **values)
        object.__setattr__(self, "model", model)
        object.__setattr__(self, "optimizer", optimizer)
        self["optimizer_state"] = optimizer.state_dict()

    def commit(self) -> None:
        self["optimizer_state"] = self.optimizer.state_dict()     # a plain value: deep-copied
        super().commit()

    def restore(self, commit: int | None = None) -> None:
        super().restore(commit)
        self.optimizer.load_state_dict(self["optimizer_state"])

    def sync(self, comm, root: int = 0) -> None:
        super().sync(comm, root)                # (a spare joining takes the optimizer's too)
        self.optimizer.load_state_dict(self["optimizer_state"])


class MicroBatchSum:
    """The step's gradient summed exactly over every rank's micro-batches: the same bits at any
    rank count. ``add()`` after each micro-batch's backward (keeps the gradients as a row and
    zeroes them); ``reduce(count, comm)``: the reproducible all-reduce of the rows' exact sum,
    divided by ``count`` (the step's number of micro-batches), into every ``.grad``."""

    def __init__(self, model: torch.nn.Module):
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.rows: list[torch.Tensor] = []

    def add(self) -> None:
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in self.params]
        self.rows.append(torch.cat([g.detach().reshape(-1) for g in grads]))
        for p in self.params:
            p.grad = None

    def reduce(self, count: int, comm) -> None:
        if not self.rows:
            raise RuntimeError("MicroBatchSum.reduce: no micro-batch was added (call add() "
                               "after each micro-batch's backward)")
        stack = torch.stack(self.rows).numpy()
        self.rows.clear()
        total = api.allreduce(reproducible.sum(stack, axis=0), reproducible=True, comm=comm)
        mean = torch.from_numpy(total / np.asarray(count, total.dtype))
        offset = 0
        for p in self.params:
            p.grad = mean[offset:offset + p.numel()].view_as(p).clone()
            offset += p.numel()


def ddp(module: torch.nn.Module, **kwargs) -> DistributedDataParallel:
    """``DistributedDataParallel(module, **kwargs)`` on the default group, with a comm hook that
    averages each bucket by ``dist.all_reduce`` (async) and notes a dead rank's
    ``ProcessFailed`` for ``run``. DDP's built-in all-reduce (no hook) crashes the process (a
    segmentation fault, torch 2.13) when a bucket's all-reduce fails in flight; through a
    Python hook the backward raises a ``RuntimeError`` instead, which has lost the cause."""
    model = DistributedDataParallel(module, **kwargs)
    model.register_comm_hook(None, _average)
    return model


_failures: list = []        # what ``_average``'s buckets failed of, since ``run`` last looked


def _average(_, bucket):
    work = dist.all_reduce(bucket.buffer(), op=dist.ReduceOp.AVG, async_op=True)

    def done(future):
        failed = _process_failed(work.exception())
        if failed is not None:
            _failures.append(failed)
        return future.value()[0]
    return work.get_future().then(done)


def _process_failed(error: BaseException | None) -> ProcessFailed | None:
    """The ``ProcessFailed`` behind a torch error (its ``__cause__`` / ``__context__`` chain)."""
    seen = set()
    while error is not None and id(error) not in seen:
        if isinstance(error, ProcessFailed):
            return error
        seen.add(id(error))
        error = error.__cause__ or error.__context__
    return None


def init_group(comm, options: Options | None = None,
               timeout: timedelta = timedelta(minutes=10)) -> None:
    """The default process group: ``"mpicoll"`` on the MPI communicator ``comm`` (collective
    over ``comm``). An existing default group -- the dead rank's -- is destroyed first."""
    if dist.is_initialized():
        dist.destroy_process_group()
    backend.WORLD = comm
    dist.init_process_group(NAME, store=store_from_mpi(comm, timeout), rank=comm.Get_rank(),
                            world_size=comm.Get_size(), timeout=timeout, pg_options=options)


def run(train, state: TorchState, comm=None, min_ranks: int = 1, spares: int = 0, *,
        options: Options | None = None, timeout: timedelta = timedelta(minutes=10)):
    """``mpicoll.elastic.run`` for torch: ``train(state, comm)`` runs with the default process
    group on ``comm`` (``"mpicoll"``, ``options``), started again on the survivors after a
    death; returns what ``train`` returns (None on a spare never needed)."""
    if not isinstance(state, TorchState):
        raise TypeError(f"state must be a mpicoll.torch.elastic.TorchState, got "
                        f"{type(state).__name__}")

    def on_group(state, comm):
        if backend.WORLD is not comm:
            gc.collect()            # the dead rank's DDP: its reducer's hooks go with it
            init_group(comm, options, timeout)
        try:
            return train(state, comm)
        except RuntimeError as error:
            failed = _process_failed(error) or (_failures[0] if _failures else None)
            _failures.clear()
            if failed is None:
                raise
            failed = (str(failed), failed.ranks, failed.hosts)
        # raised out here, without the torch error's traceback: its frames hold the old DDP
        raise ProcessFailed(*failed)

    return elastic.run(on_group, state, comm, min_ranks=min_ranks, spares=spares)
