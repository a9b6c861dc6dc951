"""Helpers for tests that run on every rank: assertions all ranks agree on.

A bare ``assert`` that fails on one rank leaves the others waiting in the next collective.
``agree`` gathers every rank's verdict first, so all ranks pass or all fail, and the failure
names the ranks and what each saw.

Also what tests and jobs/ read of a communicator's runtime without importing the private
``mpicoll._runtime`` (``nodes``, ``traffic``), and one fault to inject (``exit_in_next_call``).
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import sys
import time

import numpy as np

from . import kernels
from .settings import reload

__all__ = ["agree", "raises_everywhere", "environment", "every_case", "SWEEP_RANKS", "MPIEXEC",
           "nodes", "traffic", "exit_in_next_call", "ddp_train", "background_paused"]

# The launcher tests start jobs with: the one beside this Python (a venv's MPICH wheel), else
# the first on PATH; None if there is none.
MPIEXEC = shutil.which("mpiexec", path=os.pathsep.join(
    [os.path.dirname(sys.executable), os.environ.get("PATH", "")]))

# Up to this many ranks the MPI tests sweep every count, root and call of their loops; above it
# (5 and 8 ranks in CI: oversubscribed on a 2-core machine, each small call ~10x slower) a
# sample of them, still every algorithm, collective and form. The in-process executor's unit
# tests cover every count and root at P up to 64.
SWEEP_RANKS = 4


def every_case(size: int) -> bool:
    """Whether an MPI test at ``size`` ranks runs its full sweep (else its sample)."""
    return size <= SWEEP_RANKS


def agree(comm, ok: bool, message: str = "") -> None:
    """Raise AssertionError on every rank if ``ok`` is false on any, naming those ranks."""
    verdicts = comm.allgather((bool(ok), "" if ok else str(message)))
    bad = [(rank, msg) for rank, (good, msg) in enumerate(verdicts) if not good]
    if bad:
        raise AssertionError(f"failed on rank(s) {[r for r, _ in bad]}: " +
                             "; ".join(f"[rank {r}] {m}" for r, m in bad))


def raises_everywhere(comm, exception, fn, /, *args, match: str | None = None, **kwargs):
    """Call ``fn`` on every rank and check, collectively, that each raised ``exception``.

    Returns the exception raised on this rank.
    """
    try:
        fn(*args, **kwargs)
    except exception as exc:
        ok = match is None or re.search(match, str(exc)) is not None
        agree(comm, ok, f"{type(exc).__name__}({exc}) does not match {match!r}")
        return exc
    except Exception as exc:   # noqa: BLE001 - reported to every rank
        agree(comm, False, f"raised {type(exc).__name__}({exc}), not {exception.__name__}")
    agree(comm, False, f"did not raise {exception.__name__}")


@contextlib.contextmanager
def environment(**variables):
    """Set ``MPICOLL_*`` variables (None: unset) for the calls inside, which read them once
    (``mpicoll.settings``); restored, and read again, on the way out."""
    def put(values):
        for name, value in values.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value

    saved = {name: os.environ.get(name) for name in variables}
    try:
        put(variables)
        reload()
        yield
    finally:
        put(saved)
        reload()


def exact_input(rank: int, count: int, dtype, op: str):
    """Rank ``rank``'s input for a check whose answer is exact in any reduction order.

    Small integers (also as floats): sums stay far below 2^24, products are of +-1 and 2, so
    every algorithm, whatever its order, must give exactly ``exact_result``.
    """
    i = np.arange(count, dtype=np.int64)
    if op == "prod":        # -1 at every 4th element; a 2 at one in 32, so products stay small
        k = (i + rank) % 4
        v = np.where(k == 1, -1, 1)
        v[(k == 2) & ((i // 4 + rank) % 8 == 0)] = 2
    elif op == "sum":
        v = (i * 7 + rank * 3) % 16 - 8
    else:
        v = (i * 13 + rank * 5) % 97 - 48
    return v.astype(dtype)


def exact_result(size: int, count: int, dtype, op: str):
    """What ``op`` over ``exact_input`` of ranks 0..size-1 must give."""
    ufunc = kernels.numpy_kernel(op, dtype)
    acc = exact_input(0, count, dtype, op)
    with np.errstate(over="ignore"):
        for rank in range(1, size):
            ufunc(kernels.as_storage(acc), kernels.as_storage(exact_input(rank, count, dtype, op)))
    return acc


@contextlib.contextmanager
def background_paused():
    """No failure detector's thread for the block (``_runtime/detector.py``: a look every
    0.2 s, which makes a few objects): an allocation test traces every thread, and measures the
    calls'. Deaths are not looked for meanwhile."""
    from ._runtime import detector     # (the private runtime imports mpi4py.MPI: see _state)
    with detector.paused():
        yield


def nodes(comm, real: bool = False) -> tuple:
    """The node layout mpicoll uses on ``comm``: a tuple of nodes, each the tuple of its ranks
    (``MPICOLL_RANKS_PER_NODE=k`` makes virtual nodes of k ranks); ``real``: the launcher's
    nodes, as MPI's ``COMM_TYPE_SHARED`` groups them, whatever that setting says. Collective on
    first use."""
    st = _state(comm)
    return st.real_nodes if real else st.nodes()


def traffic(comm) -> dict:
    """The MPI executor's live byte counters on ``comm`` (``bytes_sent``, ``bytes_received``,
    ``messages_sent``, ``internode_bytes``, ``shared_bytes``): read them before and after a
    call. Collective on first use."""
    return _state(comm).traffic


def _state(comm):
    """mpicoll's state of ``comm`` (``_runtime.context.state``). The private runtime is
    imported here, at the first use, not with this module: it imports ``mpi4py.MPI``, which
    initialises MPI, and the launcher tests import ``MPIEXEC`` from here in a process that
    only starts ``mpiexec`` jobs."""
    from ._runtime.context import state
    return state(comm)


def exit_in_next_call(shared: bool) -> None:
    """Fault injection: this process exits (``os._exit(0)``) in its next collective call, mid
    transfer. ``shared`` (the call runs ``shm``): as its copy loop starts, its window ready and
    the others waiting for its flag; else in its first wait mid-schedule."""
    if shared:                  # (shm's kernels load when shm runs: tests/unit/test_lazy_imports)
        from .shm import kernels as shm_kernels
        shm_kernels.window_copy = shm_kernels.single_copy = lambda *args: os._exit(0)
        return
    from ._runtime import watch        # (see _state)
    real = watch.Watch.wait

    def dying_wait(self, requests, step, nsteps=0, *args, **kwargs):
        if isinstance(step, str) or step == min(1, nsteps - 1):
            os._exit(0)
        return real(self, requests, step, nsteps, *args, **kwargs)

    watch.Watch.wait = dying_wait


class NodeLayout:
    """A stand-in for a communicator's state (``CommState``) as ``select.decide`` reads it: the
    node layout ``nodes`` (tuples of ranks) and the real nodes (default: the same), for tests of
    the decision table without MPI."""

    def __init__(self, nodes, real_nodes=None):
        self._layout = tuple(tuple(n) for n in nodes)
        self.real_nodes = self._layout if real_nodes is None else tuple(map(tuple, real_nodes))

    def nodes(self) -> tuple:
        return self._layout

    @property
    def ranks_per_node(self):
        return max(map(len, self._layout)) if len(self._layout) > 1 else None


def ddp_train(group=None, *, steps: int = 50, seed: int = 0, batch: int = 32, lr: float = 0.05,
              hook=None, bucket_cap_mb: float = 0.01):
    """Train a seeded MLP (32 -> 64 -> 64 -> 10, ReLU, SGD) with torch's DDP over ``group``
    (None: the default group) for ``steps`` steps; returns (the final weights flattened, fp32;
    the step times in seconds). What tests/torch and jobs/experiments/torch_backends.py compare
    across backends (needs torch).

    Every rank draws its own batch of generated data (seeded by ``seed``, rank and step), so
    the gradients differ across ranks and DDP must average them. Small buckets (10 KB: three
    of them for the 7k parameters) so several all-reduces are in flight per backward pass.
    """
    import torch                        # (an optional dependency: mpicoll[torch])
    import torch.distributed as dist
    F, DDP = torch.nn.functional, torch.nn.parallel.DistributedDataParallel
    features, hidden, classes = 32, 64, 10
    torch.set_num_threads(1)
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(features, hidden), torch.nn.ReLU(),
                                torch.nn.Linear(hidden, hidden), torch.nn.ReLU(),
                                torch.nn.Linear(hidden, classes))
    ddp = DDP(model, process_group=group, bucket_cap_mb=bucket_cap_mb)
    if hook is not None:
        ddp.register_comm_hook(None if group is None else group, hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=lr)
    rank = dist.get_rank(group)
    gen = torch.Generator().manual_seed(seed * 7919 + 1000003 * rank + 17)
    teacher = torch.Generator().manual_seed(seed + 1)
    w_teacher = torch.randn(features, classes, generator=teacher)
    times = []
    for _ in range(steps):
        x = torch.randn(batch, features, generator=gen)
        y = (x @ w_teacher).argmax(dim=1)
        started = time.perf_counter()
        opt.zero_grad(set_to_none=False)
        loss = F.cross_entropy(ddp(x), y)
        loss.backward()
        opt.step()
        times.append(time.perf_counter() - started)
    weights = torch.cat([p.detach().reshape(-1) for p in model.parameters()]).clone()
    return weights, times
