"""One collective, one path: every form of a call makes the same plan and gives the same bits.

For every collective x algorithm (and ``auto``) x form -- blocking, nonblocking, persistent run
now (``h()``), persistent started (``start``/``wait``), ``mpicoll.Comm``, and for the
all-reduce the same forms in place (``sendbuf=MPI.IN_PLACE``) with ``Buckets`` (which reduces
its buffer in place) -- with the same arguments, on the machine's own nodes and on virtual
nodes of 2 ranks: the same algorithm name and options (``Plan``), the same counted bytes (the
executor's counters), and bit-identical results (in place and out of place too).
"""

import numpy as np
import pytest
from mpi4py import MPI

import mpicoll
from mpicoll import plan, settings
from mpicoll._runtime.context import state
from mpicoll.registry import COLLECTIVES
from mpicoll.testing import SWEEP_RANKS, agree, environment, every_case

pytestmark = pytest.mark.mpi
CASES = [(c, a) for c, table in COLLECTIVES.items() for a in [*table, "auto"]]
SAMPLED = ("auto", "ring", "hierarchical", "shm", "mpi")      # above SWEEP_RANKS ranks
COUNTS = (37, 16384)        # 16384 float64: 128 KiB, in shm's band (the issue's hierarchical row)


def _inputs(collective, comm, n):
    """(sendbuf, a fresh recvbuf) of collective for ``n`` elements per block, exact sums."""
    rank, size = comm.rank, comm.size
    rng = np.random.default_rng(1000 + rank)
    if collective == "allreduce":
        return rng.integers(-8, 8, n).astype(np.float64), np.empty(n)
    if collective == "reduce_scatter_block":
        return rng.integers(-8, 8, n * size).astype(np.float64), np.empty(n)
    if collective == "allgather":
        return rng.integers(-8, 8, n).astype(np.float64), np.empty(n * size)
    buf = rng.integers(-8, 8, n).astype(np.float64) if rank == 0 else np.zeros(n)
    return buf, buf


def _forms(collective, algorithm, comm, in_place=False):
    """form name -> run(send, recv) -> (result, plan); ``in_place``: each form called with
    ``MPI.IN_PLACE``, its input copied into recv first (the all-reduce)."""
    blocking = getattr(mpicoll, collective)
    nonblocking = getattr(mpicoll, "i" + collective)
    init = getattr(mpicoll, collective + "_init")
    wrapped = mpicoll.Comm(comm, algorithm)
    kw = dict(algorithm=algorithm, comm=comm)

    def place(send, recv):
        if not in_place:
            return send
        recv[...] = send
        return MPI.IN_PLACE

    def call(fn, send, recv):
        return fn(recv, 0, **kw) if collective == "bcast" else fn(place(send, recv), recv, **kw)

    def run_blocking(send, recv):
        out = call(blocking, send, recv)
        return out, plan.last(comm)

    def run_nonblocking(send, recv):
        req = call(nonblocking, send, recv)
        made = plan.last(comm)
        return req.wait(), made

    def run_now(send, recv):
        h = call(init, send, recv)
        return h(), h.plan

    def run_started(send, recv):
        h = call(init, send, recv)
        h.start()
        return h.wait(), h.plan

    def run_comm(send, recv):
        if collective == "bcast":
            wrapped.Bcast(recv, 0)
        else:
            getattr(wrapped, {"allreduce": "Allreduce", "allgather": "Allgather",
                              "reduce_scatter_block": "Reduce_scatter_block"}[collective])(
                place(send, recv), recv)
        return recv, plan.last(comm)

    forms = {"blocking": run_blocking, "nonblocking": run_nonblocking,
             "persistent": run_now, "started": run_started, "Comm": run_comm}
    if collective == "allreduce" and in_place:
        def run_buckets(send, recv):
            grads = send.copy()
            b = mpicoll.Buckets([grads], average=False, **kw)
            b.ready(0)
            b.wait()
            return grads, b._prepared[0].plan
        forms["Buckets"] = run_buckets
    return forms


def _check_forms(comm, collective, algorithm, n):
    st = state(comm)
    bits = {}
    for in_place in (False, True) if collective == "allreduce" else (False,):
        seen = {}
        for form, run in _forms(collective, algorithm, comm, in_place).items():
            send, recv = _inputs(collective, comm, n)
            before = dict(st.traffic)
            out, made = run(send, recv)
            counted = {k: st.traffic[k] - before[k]
                       for k in ("bytes_sent", "messages_sent", "internode_bytes")}
            form = f"{form} in place" if in_place else form
            seen[form] = bits[form] = (made.algorithm.name, sorted(made.options.items()),
                                       counted, np.asarray(out).tobytes())
        _same(comm, collective, algorithm, n, seen, ("algorithm", "options", "counted bytes",
                                                     "result bits"))
    _same(comm, collective, algorithm, n, {f: got[3:] for f, got in bits.items()},
          ("result bits",))


def _same(comm, collective, algorithm, n, seen, whats):
    first_form, first = next(iter(seen.items()))
    for form, got in seen.items():
        for what, a, b in zip(whats, first, got):
            agree(comm, a == b, f"{collective} {algorithm} n={n}: {form} gives {what} "
                  f"{'(differs)' if what == 'result bits' else b}, {first_form} "
                  f"{'' if what == 'result bits' else a}")


@pytest.mark.parametrize("collective,algorithm", CASES)
@pytest.mark.parametrize("n", COUNTS)
def test_every_form_runs_the_same_plan(comm, collective, algorithm, n):
    if not every_case(comm.size) and (n != COUNTS[-1] or algorithm not in SAMPLED):
        pytest.skip(f"above {SWEEP_RANKS} ranks (oversubscribed here) a sample: "
                    "fewer ranks run them all")
    _check_forms(comm, collective, algorithm, n)


@pytest.mark.parametrize("collective,algorithm",
                         [c for c in CASES if c[1] in ("hierarchical", "ring", "auto")])
def test_every_form_runs_the_same_plan_on_virtual_nodes(comm, collective, algorithm):
    if comm.size < 4:
        pytest.skip("virtual nodes of 2 ranks need 4 ranks or more")
    with environment(MPICOLL_RANKS_PER_NODE="2"):
        try:
            _check_forms(comm, collective, algorithm, 16384)
        finally:
            settings.reload()


def test_the_issues_hierarchical_row(comm):
    """hierarchical at 128 KiB float64: the same algorithm, options, bytes and bits blocking,
    nonblocking and persistent (it ran its node phases in shared memory only blocking)."""
    _check_forms(comm, "allreduce", "hierarchical", 16384)


def _start_then_ssend(comm, start):
    """Rank 0 calls ``start()`` then ``Ssend``s to rank 1, which receives before its own
    ``start()``; returns what ``start()`` returned."""
    token = np.zeros(1)
    if comm.rank == 0:
        started = start()
        comm.Ssend(token, dest=1, tag=7)
    elif comm.rank == 1:
        comm.Recv(token, source=0, tag=7)
        started = start()
    else:
        started = start()
    return started


def test_start_then_ssend_completes(comm):
    """A valid MPI program: rank 0 starts a collective, then Ssends to rank 1, which receives
    before it starts its own. Every start returns at once, so it completes (I* forms on a
    communicator used before, and *_init handles)."""
    if comm.size < 2:
        pytest.skip("needs two ranks")
    x = np.ones(1024)
    mpicoll.allreduce(x.copy(), comm=comm)                  # the communicator is known
    h = mpicoll.allreduce_init(x, np.empty(1024), comm=comm, algorithm="ring")
    for start in (lambda: mpicoll.iallreduce(x, np.empty(1024), comm=comm, algorithm="ring"),
                  lambda: (h.start(), h)[1]):
        out = _start_then_ssend(comm, start).wait()
        agree(comm, np.array_equal(out, np.full(1024, float(comm.size))), "wrong sum")


def test_start_then_ssend_completes_through_the_drop_in(comm):
    """The same program with mpicoll.Comm's persistent request: its Start() returns at once
    (the progress thread runs the collective), and MPI's own Waitall, mixed with an MPI
    request, waits for the collective."""
    if comm.size < 2:
        pytest.skip("needs two ranks")
    from mpi4py import MPI
    from mpicoll.executors import progress
    if progress.mode() != "thread":
        pytest.skip("without the progress thread Start() runs the whole collective")
    mc = mpicoll.Comm(comm, algorithm="ring")
    x, out = np.ones(1024), np.empty(1024)
    mc.Allreduce(x, out)                                    # the communicator is known
    handle = mc.Allreduce_init(x, out)
    try:
        for step in range(3):
            x[:] = step + 1
            _start_then_ssend(comm, lambda: handle.Start())
            token = np.zeros(1)
            other = [comm.Irecv(token, source=(comm.rank - 1) % comm.size, tag=8),
                     comm.Isend(np.ones(1), dest=(comm.rank + 1) % comm.size, tag=8)]
            MPI.Request.Waitall([handle] + other)
            agree(comm, np.array_equal(out, np.full(1024, float(comm.size * (step + 1))))
                  and token[0] == 1.0, f"step {step}: wrong sum {out[:2]} or token {token}")
    finally:
        handle.Free()


@pytest.mark.parametrize("collective", ["iallreduce", "ireduce_scatter_block", "iallgather",
                                        "ibcast", "Comm.Iallreduce", "two in a row"])
@pytest.mark.usefixtures("background_start")        # (conftest: set, or skipped)
def test_start_then_ssend_completes_on_a_fresh_communicator(comm, collective):
    """The same program on a communicator mpicoll has never seen: the first nonblocking call
    sets the communicator up in the background (executors/background.py) and returns at once. A
    second call right behind it keeps its place; a blocking call after them waits for them."""
    n, size = 12, comm.size
    fresh = comm.Dup()
    x = np.arange(n * size, dtype=np.float64) + comm.rank

    def begin():
        if collective == "iallreduce":
            return [mpicoll.iallreduce(x, np.empty_like(x), comm=fresh)]
        if collective == "ireduce_scatter_block":
            return [mpicoll.ireduce_scatter_block(x, np.empty(n), comm=fresh)]
        if collective == "iallgather":
            return [mpicoll.iallgather(x[:n], np.empty(n * size), comm=fresh)]
        if collective == "ibcast":
            return [mpicoll.ibcast(x.copy(), root=size - 1, comm=fresh)]
        if collective == "Comm.Iallreduce":
            out = np.empty_like(x)
            req = mpicoll.Comm(fresh).Iallreduce(x, out)
            req.result = out
            return [req]
        return [mpicoll.iallreduce(x, np.empty_like(x), comm=fresh, algorithm="ring"),
                mpicoll.iallgather(x[:n], np.empty(n * size), comm=fresh)]
    try:
        reqs = _start_then_ssend(fresh, begin)
        got = []
        for req in reqs:
            if isinstance(req, MPI.Request):
                req.Wait()
                got.append(req.result)
            else:
                got.append(req.wait())
        total = size * np.arange(n * size, dtype=np.float64) + size * (size - 1) / 2
        want = {"iallreduce": [total], "ireduce_scatter_block":
                [total[comm.rank * n:(comm.rank + 1) * n]],
                "iallgather": [np.concatenate([np.arange(n) + r for r in range(size)])],
                "ibcast": [np.arange(n * size) + size - 1.0], "Comm.Iallreduce": [total],
                "two in a row": [total, np.concatenate([np.arange(n) + r
                                                        for r in range(size)])]}[collective]
        agree(comm, all(np.array_equal(g, w) for g, w in zip(got, want)), f"got {got}")
        after = mpicoll.allreduce(np.ones(3), comm=fresh)           # a blocking call after
        agree(comm, np.array_equal(after, np.full(3, size)), f"then {after}")
    finally:
        fresh.Free()


@pytest.mark.parametrize("who", ["thread", "caller"])
def test_buckets_missed_ready_raises_on_every_rank_then_recovers(comm, who):
    """Rank 0 misses ``ready(1)`` once: every rank raises (no rank gets a wrong sum silently),
    and the next step is right everywhere; with either progress."""
    g = [np.full(5, comm.rank + 1.0), np.full(3, comm.rank + 1.0)]
    b = mpicoll.Buckets(g, 16, average=False, comm=comm, progress=who)
    assert len(b.buckets) == 2
    b.ready(0)
    if comm.rank != 0:
        b.ready(1)
    try:
        b.wait()
        raised = None
    except ValueError as e:
        raised = str(e)
    agree(comm, comm.size == 1 or (raised is not None and "rank(s) [0]" in raised),
          f"raised {raised!r}")
    for a in g:
        a[...] = comm.rank + 1.0
    b.ready(1)
    b.ready(0)
    b.wait()
    want = comm.size * (comm.size + 1) / 2
    agree(comm, all((a == want).all() for a in g), f"after the failed step: {g}")


@pytest.mark.parametrize("variable, values, field", [
    ("MPICOLL_EXECUTOR", ("python", "compiled"), "executor"),
    ("MPICOLL_SEGMENT_BYTES", ("1M", "2M"), "segments"),
])
def test_a_per_rank_choice_that_differs_is_an_argument_mismatch(comm, variable, values, field):
    """Rank 0 runs another executor, or splits messages by another segment rule, than the
    others: every rank raises ArgumentMismatch naming the field (never a bare MPI error)."""
    from mpicoll.errors import ArgumentMismatch
    from mpicoll.executors import compiled
    from mpicoll.testing import raises_everywhere
    if comm.size < 2 or compiled.available() is not None:
        pytest.skip("needs two ranks and the compiled executor")
    x = np.ones(1 << 19, np.float32)         # 2 MiB: segmented by a 1 MiB rule
    with environment(**{variable: values[0] if comm.rank == 0 else values[1]}):
        raises_everywhere(comm, ArgumentMismatch, mpicoll.allreduce, x, algorithm="ring",
                          comm=comm, timeout=30, match=field)
