"""``mpicoll.shm`` without MPI: threads play the ranks on one shared array.

``kernels.window_copy`` is compiled ``nogil``, so p threads run it truly at once on one region
laid out as the window is (flags, then 2 x p segments): the same protocol, the same flags, the
same double buffering, with a chunk of a few elements so that one call goes through dozens of
chunks and both buffers are reused again and again while other threads still read them. Every
call must give every thread numpy's rank-order bits, for every op and dtype MPI allows. The
single-copy core (``kernels.single_copy``) runs the same way: every thread publishes this
process's pid, so its ``process_vm_readv`` reads the other threads' buffers through the kernel
as it reads another process's. Also checked: the flags are atomic acquire loads and release
stores in the compiled code (the memory-ordering argument of ``mpicoll.shm``), a window made on
``COMM_SELF`` leaves no file behind, and a dead or aborted peer ends a call with
``CommunicatorBroken``.
"""

import mmap
import os
import re
import subprocess
import sys
import threading
import time
import types as pytypes

import numpy as np
import pytest
from mpi4py import MPI
from numba import njit, types

from mpicoll import kernels as K
from mpicoll import shm
from mpicoll._runtime.context import CommState
from mpicoll.algorithms import allreduce_shm
from mpicoll.errors import CommunicatorBroken
from mpicoll.shm import kernels as core
from mpicoll.shm import probe, transport, window

ORIGINAL = tuple(np.dtype(t) for t in (np.float32, np.float64, np.int32, np.int64))


def run_ranks(inputs, op, chunk, calls, yield_after=0.0, nodes=None, single=None,
              inplace=False):
    """``calls`` all-reduces of ``inputs`` (one per thread-rank), on one region; the outputs.

    ``nodes``: hierarchical's shared-memory node phases instead -- that many regions (one per
    node) of ``len(inputs) // nodes`` threads each, and ``between`` (what the inter-node
    all-reduce does) a left fold over the nodes of the same local rank's slices, in node order,
    met at a barrier. ``single``: the single-copy core instead, ``"whole"`` or ``"slice"``
    (``chunk``: the elements per other rank of its scratch); ``inplace``: each thread's input
    is its output. Half types run as their uint16 bits, as ``transport`` runs them."""
    p, user = len(inputs), inputs[0].dtype
    dtype, (kernel, combiner) = K.storage(user), core.entry_points(op, user)
    L = p // (nodes or 1)
    regions = [(np.zeros(core.FLAGS * L * core.LINE, np.int64), np.zeros((2, L, chunk), dtype))
               for _ in range(nodes or 1)]
    for flags, _ in regions:
        flags[core.PID::core.FLAGS * core.LINE] = os.getpid()
    meet = [threading.Barrier(nodes or 1) for _ in range(L)]
    slots = {}
    outs = [[None] * calls for _ in range(p)]
    errors = []
    nchunks = max(1, -(-inputs[0].size // chunk))

    def between(node, local, dst, resume, data, seq0):
        c = resume // 4
        at = c * chunk
        if single:          # one "chunk": the whole vector
            lo, hi = core.slice_of(dst.size, L, local)
            part = dst[lo:hi]
        else:
            lo, hi = core.slice_of(min(chunk, dst.size - at), L, local)
            part = dst[at + lo:at + hi]
        slots[node, local] = part.copy()
        meet[local].wait(60)
        total = slots[0, local].copy()
        for j in range(1, nodes):
            np.add(total, slots[j, local], out=total)
        meet[local].wait(60)        # every node has read every slot
        part[:] = total
        if not single:
            data[(seq0 + c) % 2, local, lo:hi] = part

    def rank(r):
        node, local = divmod(r, L)
        flags, data = regions[node]
        try:
            acc = np.empty(core.BLOCK, dtype)
            scratch, iov = np.empty(chunk * max(1, L - 1), dtype), np.zeros(4, np.int64)
            for k in range(calls):
                dst = K.as_storage(inputs[r].copy() if inplace else np.empty_like(inputs[r]))
                src = dst if inplace else K.as_storage(inputs[r])
                seq0, resume = 1 + k * nchunks, 0
                while True:
                    if single:
                        resume, waiting = core.single_copy(
                            src, dst, flags, local, 1 + k, resume, kernel, combiner, acc,
                            scratch, chunk, iov, MPI.Wtime() + 0.01, yield_after, 7,
                            single == "whole", nodes is not None)
                    else:
                        resume, waiting = core.window_copy(
                            src, dst, data, flags, local, seq0, resume, kernel,
                            acc, MPI.Wtime() + 0.01, yield_after, 7, nodes is not None)
                    if resume == core.DONE:
                        break
                    assert resume >= 0, (resume, waiting)
                    if waiting == core.BETWEEN:
                        between(node, local, dst, resume, data, seq0)
                outs[r][k] = dst.view(user).copy()
        except Exception as exc:        # noqa: BLE001 - reported by the test
            errors.append(exc)

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(p)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors and not any(t.is_alive() for t in threads), errors
    return outs


def rank_order(inputs, op):
    """numpy's left fold in rank order: ``acc = x_0; ufunc(acc, x_j, out=acc)`` (numpy's
    ufunc, or ml_dtypes' for bfloat16: ``kernels.numpy_kernel``)."""
    want = inputs[0].copy()
    fold = K.numpy_kernel(op, want.dtype)
    for x in inputs[1:]:
        fold(K.as_storage(want), K.as_storage(x))
    return want


def make_inputs(rng, p, count, dtype, op):
    """p inputs of ``dtype`` that exercise ``op``: floats of mixed magnitude (NaNs and signed
    zeros for max and min), integers that wrap around, truth values as 0/1 and other numbers."""
    dtype = np.dtype(dtype)
    if dtype.kind == "b":
        return [rng.integers(0, 2, count).astype(bool) for _ in range(p)]
    if dtype.kind in "iu":
        if op in ("band", "bor", "bxor", "sum"):      # every bit pattern (sums wrap around)
            return [np.frombuffer(rng.bytes(count * dtype.itemsize), dtype).copy()
                    for _ in range(p)]
        return [rng.integers(-3 if op in ("prod", "max", "min") else 0, 4, count)
                .astype(dtype) for _ in range(p)]
    if dtype.kind == "c":
        return [(rng.standard_normal(count) + 1j * rng.standard_normal(count)).astype(dtype)
                for _ in range(p)]
    scale = 1 if op == "prod" else 1e3
    xs = [(rng.standard_normal(count) * scale).astype(np.float32).astype(dtype)
          for _ in range(p)]
    if op in ("max", "min") and count > 3:
        for r, x in enumerate(xs):
            x[r % count] = np.nan       # NaN against numbers, NaN against NaN
            x[3] = np.nan
            x[2] = -0.0 if r % 2 else 0.0
    return xs


def same_bits(got, want) -> bool:
    return got.tobytes() == want.tobytes()


@pytest.mark.parametrize("single", [None, "slice", "whole"])
@pytest.mark.parametrize("p", [1, 2, 3, 4])
@pytest.mark.parametrize("op", ["sum", "prod", "max", "min"])
def test_threads_as_ranks_get_rank_order_bits(p, op, single):
    """mpicoll's four original dtypes, counts around p and a long one, out of place and in
    place (the single copy's whole mode falls back to slices in place): numpy's rank-order
    bits everywhere, NaNs included for max and min."""
    rng = np.random.default_rng(p)
    for dtype in ORIGINAL:
        for count in sorted({0, 1, p - 1, p + 1, 7, 1000}):
            inputs = make_inputs(rng, p, count, dtype, op)
            want = rank_order(inputs, op)
            for inplace in (False, True):
                outs = run_ranks(inputs, op, chunk=5 + p, calls=3, single=single,
                                 inplace=inplace)
                for r in range(p):
                    for k in range(3):
                        assert same_bits(outs[r][k], want), \
                            f"{dtype} count={count} rank {r} call {k} in place {inplace}"


@pytest.mark.parametrize("op", K.OPS)
def test_every_op_and_dtype_mpi_allows(op):
    """Every dtype ``op`` applies to (``kernels.ops_for``: half types as their bits, complex,
    bool, every integer width): window copy at 3 ranks, single copy by slices at 3 ranks and
    whole at 2, in and out of place -- the rank-order bits of numpy's (ml_dtypes') ufunc."""
    rng = np.random.default_rng(sum(map(ord, op)))
    dtypes = [d for d in K.DTYPES if K.allowed(op, d)]
    assert dtypes and all(shm.supports(op, d) for d in dtypes)
    for dtype in dtypes:
        for p, single in ((3, None), (3, "slice"), (2, "whole")):
            for count in (4, 300):
                inputs = make_inputs(rng, p, count, dtype, op)
                want = rank_order(inputs, op)
                for inplace in (False, True):
                    outs = run_ranks(inputs, op, chunk=7, calls=2, single=single,
                                     inplace=inplace)
                    bad = [(r, k) for r in range(p) for k in range(2)
                           if not same_bits(outs[r][k], want)]
                    assert not bad, f"{dtype} {op} p={p} {single} n={count} in place " \
                                    f"{inplace}: rank, call {bad[:3]}"


def test_supports_exactly_mpis_pairs():
    """``shm`` refuses only what MPI refuses (the op doesn't apply to the type)."""
    for dtype in K.DTYPES:
        for op in K.OPS:
            assert shm.supports(op, dtype) == K.allowed(op, dtype), (op, dtype)
    assert not shm.supports("sum", np.dtype("S4"))


def test_many_chunks_both_yield_policies():
    """A long run at p = 3 and 4: 2,000 chunks per call, the buffers reused 1,000 times each."""
    for p in (3, 4):
        rng = np.random.default_rng(7)
        inputs = [rng.standard_normal(20_000) for _ in range(p)]
        want = rank_order(inputs, "sum")
        for yield_after in (0.0, window.YIELD_AFTER):
            outs = run_ranks(inputs, "sum", chunk=10, calls=2, yield_after=yield_after)
            assert all(same_bits(o, want) for ranks in outs for o in ranks)


def test_flags_are_acquire_loads_and_release_stores():
    """The compiled code reads each flag with ``load atomic ... acquire`` and writes it with
    ``store atomic ... release`` -- not plain loads that LLVM could hoist out of the spin."""
    f64, i64 = types.Array(types.float64, 1, "C"), types.int64
    flags = types.Array(types.int64, 1, "C")
    wait = njit(core.missing.py_func)         # fresh, uncached: numba shows a cached one's IR
    wait.compile((flags, i64, i64, i64, i64, types.float64, types.float64))
    run = njit(core.window_copy.py_func)
    run.compile((f64, f64, types.Array(types.float64, 3, "C"), flags, i64, i64, i64, i64, f64,
                 types.float64, types.float64, i64, types.boolean))
    loads = "\n".join(wait.inspect_llvm().values())
    stores = "\n".join(run.inspect_llvm().values())
    assert re.search(r"load atomic i64, (ptr|i64\*) %\S+ acquire", loads), "no acquire load"
    assert re.search(r"store atomic i64 %\S+, (ptr|i64\*) %\S+ release", stores), \
        "no release store"


@pytest.mark.parametrize("single", [None, "slice"])
@pytest.mark.parametrize("nodes, L", [(2, 1), (2, 2), (3, 2), (2, 3)])
def test_node_phases_around_a_between_phase(nodes, L, single):
    """hierarchical(inner="shm"): Phases 1-2 reduce my slice inside the node, ``between``
    all-reduces it across the nodes, Phase 3 gathers: every rank gets the fold over nodes of
    each node's rank-order fold, chunk after chunk, call after call."""
    rng = np.random.default_rng([nodes, L])
    p = nodes * L
    for count in (1, L + 1, 1000):
        inputs = [rng.standard_normal(count) for _ in range(p)]
        node_sums = [rank_order(inputs[node * L:(node + 1) * L], "sum") for node in range(nodes)]
        want = rank_order(node_sums, "sum")
        outs = run_ranks(inputs, "sum", chunk=7 + p, calls=3, nodes=nodes, single=single)
        for r in range(p):
            for k in range(3):
                assert same_bits(outs[r][k], want), f"count={count} rank {r} call {k}"


def test_a_window_on_one_rank_leaves_no_file():
    """``window.make`` on COMM_SELF: mapped, probed (one rank: no single copy), its file in
    /dev/shm already unlinked; ``free`` is local and may be called twice."""
    before = set(os.listdir(window._directory()))
    w = window.make(MPI.COMM_SELF, (0,), window.size_class(10), 0, True, lambda: None,
                    lambda *a: pytest.fail("no wait should be overdue"))
    assert w.capacity == window.MIN_BYTES and w.seq == 1 and not w.single_copy
    assert w.pid(0) == os.getpid()
    assert set(os.listdir(window._directory())) - before == set()
    w.free()
    w.free()


def fake_window(pid_of_peer: int, capacity: int = window.MIN_BYTES):
    """A two-rank window over anonymous memory, this process rank 0, the peer ``pid``."""
    total = core.FLAGS * 2 * core.LINE * 8 + 2 * 2 * capacity
    w = window.Window(mmap.mmap(-1, total), (0, 1), 0, capacity)
    w.flags[core.PID] = os.getpid()
    w.flags[core.FLAGS * core.LINE + core.PID] = pid_of_peer
    return w


class _FakeState(pytypes.SimpleNamespace):
    """What shm's transport reads and changes of a communicator's state (``CommState``)."""
    mark_broken = CommState.mark_broken


def fake_state():
    return _FakeState(broken=None, traffic={"shared_bytes": 0})


def dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_a_dead_peer_ends_the_wait_and_breaks_the_communicator():
    """A wait that outlasts its spin looks at the window's ranks: the peer's process is gone
    (or a zombie), so the call raises CommunicatorBroken naming it, marks the communicator
    broken and publishes ``aborted`` for the ranks waiting on this one -- with no deadline."""
    assert probe.alive(os.getpid())
    zombie = subprocess.Popen([sys.executable, "-c", "pass"])
    try:
        for _ in range(200):
            if not probe.alive(zombie.pid):
                break
            threading.Event().wait(0.01)
        assert not probe.alive(zombie.pid), "a zombie counts as dead"
    finally:
        zombie.wait()
    w, st = fake_window(dead_pid()), fake_state()
    with pytest.raises(CommunicatorBroken, match=r"rank 1 \(pid \d+\) died"):
        w.wait(core.ARRIVED, 2, lambda win, which, seq, j: transport._late(
            st, win, lambda: None, which, seq, j, "test", 1))
    assert "died" in st.broken and w.flags[core.ABORTED] == 1


def test_an_aborted_peer_ends_the_wait():
    """The peer lives but published ``aborted``: this rank's wait ends as well."""
    w, st = fake_window(os.getpid()), fake_state()
    w.flags[core.FLAGS * core.LINE + core.ABORTED] = 1
    with pytest.raises(CommunicatorBroken, match="rank 1 gave up"):
        transport._late(st, w, lambda: None, core.ARRIVED, 2, 1, "test", 1)
    assert st.broken


@pytest.mark.skipif(not probe.HAVE_READV, reason="no process_vm_readv")
def test_single_copy_from_a_dead_peer_breaks_the_communicator():
    """Single copy: the peer published its buffers and died; reading them fails, and the call
    raises CommunicatorBroken naming the dead rank (not a bare RuntimeError)."""
    w, st = fake_window(dead_pid()), fake_state()
    peer = core.FLAGS * core.LINE
    w.flags[peer + core.SIGNATURE] = 5
    w.flags[peer + core.SRC] = w.flags[peer + core.DST] = 4096
    w.flags[peer + core.ARRIVED * core.LINE] = 2
    w.seq = 1
    x = np.ones(5000)
    with pytest.raises(CommunicatorBroken, match="died during the call"):
        transport._single_copy(st, w, x, np.empty_like(x), x, core.entry_points("sum", x.dtype),
                               lambda: None, 5, None, None)
    assert st.broken and w.flags[core.ABORTED] == 1


def test_single_copy_scratch_kept_per_count():
    """``Window.scratch``: room for ``piece`` elements of each other rank, the same arrays
    for the next call of the same count, a larger array when a longer vector needs more (which
    then serves the shorter counts too), and at most 64 counts remembered."""
    region = mmap.mmap(-1, window.footprint(3, window.MIN_BYTES))
    w = window.Window(region, (0, 1, 2), 0, window.MIN_BYTES)
    f4 = np.dtype(np.float32)
    small, piece = w.scratch(f4, 10, 1 << 10)
    assert piece == 10 and small.size == 20
    assert w.scratch(f4, 10, 1 << 10)[0] is small
    big, piece = w.scratch(f4, 1000, 1 << 10)       # 1 KiB / 2 ranks / 4 B: 128 each
    assert piece == 128 and big.size == 256
    again, piece = w.scratch(f4, 10, 1 << 10)
    assert again is big and piece == 128
    for count in range(1, 100):
        scratch, piece = w.scratch(f4, count, 1 << 10)
        assert scratch is big and piece >= count and scratch.size >= 2 * piece
    assert len(w._pieces) <= 64
    w.free()


def test_size_classes():
    assert shm.size_class(0) == shm.size_class(1) == shm.MIN_BYTES
    assert shm.size_class(shm.MIN_BYTES + 1) == 2 * shm.MIN_BYTES
    assert shm.size_class(1 << 30) == shm.CHUNK_BYTES


def test_cost_formula():
    assert allreduce_shm.cost(1, 1e6, 1, 1, 1) == 0.0
    # p = 2: 2 alpha + 2 n beta + n/2 gamma
    assert allreduce_shm.cost(2, 1000.0, 1.0, 0.01, 0.001) == pytest.approx(2 + 20 + 0.5)
    assert allreduce_shm.bytes_sent(0, 4, 1e6) == 0.0


def _windows(size):
    """``size`` ranks' views of one window (an anonymous shared map, as one node's file)."""
    region = mmap.mmap(-1, window.footprint(size, window.MIN_BYTES))
    return [window.Window(region, tuple(range(size)), r, window.MIN_BYTES) for r in range(size)]


def test_a_ring_wakes_a_napping_rank():
    """A nap on the bell (the futex) ends at a ring, long before its own end (30 s), and at
    once when a ring came since the bell was read; the ringer wakes only a napping rank."""
    a, b = _windows(2)
    woke = []
    seen = a.bell()
    napper = threading.Thread(target=lambda: (a.nap(seen, 30.0), woke.append(1)))
    napper.start()
    deadline = time.monotonic() + 20
    while not a._words[window.NAPPING] and time.monotonic() < deadline:
        time.sleep(0.01)                # (until it naps)
    b.ring()
    napper.join(20)
    assert woke == [1] and a.bell() != seen
    stale = a.bell()
    b.ring()
    started = time.monotonic()
    a.nap(stale, 30.0)                  # rung since ``stale``: no sleep
    assert time.monotonic() - started < 20
    assert not a._words[window.NAPPING]


def test_patience_naps_grow_with_lateness():
    """``Patience``: a full spin first, then naps of NAP_SECONDS growing to NAP_SHARE of the
    lateness, capped at NAP_MAX_SECONDS (without a window: plain sleeps)."""
    p = window.Patience()
    assert p.until(0) - MPI.Wtime() > window.NAP_SPIN_SECONDS      # not late: a spin
    p.late(1)
    p._since -= 1.0                     # late for a second: the longest nap
    started = time.monotonic()
    p.until(1)
    assert time.monotonic() - started >= window.NAP_MAX_SECONDS * 0.9
