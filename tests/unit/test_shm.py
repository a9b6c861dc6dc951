"""``shm``'s compiled core without MPI: threads play the ranks on one shared array.

``_allreduce`` is compiled ``nogil``, so p threads run it truly at once on one region laid out
as the window is (flags, then 2 x p segments): the same protocol, the same flags, the same
double buffering, with a chunk of a few elements so that one call goes through dozens of chunks
and both buffers are reused again and again while other threads still read them. Every call
must give every thread numpy's rank-order bits. The single-copy core (``_allreduce_single``)
runs the same way: every thread publishes this process's pid, so its ``process_vm_readv``
reads the other threads' buffers through the kernel as it reads another process's. Also
checked: the flags are atomic acquire loads and release stores in the compiled code (the
memory-ordering argument of the module).
"""

import os
import re
import threading

import numpy as np
import pytest
from mpi4py import MPI
from numba import njit, types

from mpicoll.algorithms import allreduce_shm as shm

UFUNC = {"sum": np.add, "prod": np.multiply, "max": np.maximum, "min": np.minimum}


def run_ranks(inputs, op, chunk, calls, yield_after=0.0, nodes=None, single=None,
              inplace=False):
    """``calls`` all-reduces of ``inputs`` (one per thread-rank), on one region; the outputs.

    ``nodes``: hierarchical's shared-memory node phases instead -- that many regions (one per
    node) of ``len(inputs) // nodes`` threads each, and ``between`` (what the inter-node
    all-reduce does) a left fold over the nodes of the same local rank's slices, in node order,
    met at a barrier. ``single``: the single-copy core instead, ``"whole"`` or ``"slice"``
    (``chunk``: the elements per other rank of its scratch); ``inplace``: each thread's input
    is its output."""
    p, dtype = len(inputs), inputs[0].dtype
    L = p // (nodes or 1)
    regions = [(np.zeros(shm.FLAGS * L * shm.LINE, np.int64), np.zeros((2, L, chunk), dtype))
               for _ in range(nodes or 1)]
    for flags, _ in regions:
        flags[shm.PID::shm.FLAGS * shm.LINE] = os.getpid()
    meet = [threading.Barrier(nodes or 1) for _ in range(L)]
    slots = {}
    outs = [[None] * calls for _ in range(p)]
    errors = []
    nchunks = max(1, -(-inputs[0].size // chunk))

    def between(node, local, dst, resume, data, seq0):
        c = resume // 4
        at = c * chunk
        if single:          # one "chunk": the whole vector
            lo, hi = shm._slice(dst.size, L, local)
            part = dst[lo:hi]
        else:
            lo, hi = shm._slice(min(chunk, dst.size - at), L, local)
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
            acc = np.empty(shm.BLOCK, dtype)
            scratch, iov = np.empty(chunk * max(1, L - 1), dtype), np.zeros(4, np.int64)
            for k in range(calls):
                dst = inputs[r].copy() if inplace else np.empty_like(inputs[r])
                src = dst if inplace else inputs[r]
                seq0, resume = 1 + k * nchunks, 0
                while True:
                    if single:
                        resume, waiting = shm._allreduce_single(
                            src, dst, flags, local, 1 + k, resume, shm.OPS.index(op), acc,
                            scratch, chunk, iov, MPI.Wtime() + 0.01, yield_after, 7,
                            single == "whole", nodes is not None)
                    else:
                        resume, waiting = shm._allreduce(
                            src, dst, data, flags, local, seq0, resume, shm.OPS.index(op),
                            acc, MPI.Wtime() + 0.01, yield_after, 7, nodes is not None)
                    if resume == shm.DONE:
                        break
                    assert resume >= 0, (resume, waiting)
                    if waiting == shm.BETWEEN:
                        between(node, local, dst, resume, data, seq0)
                outs[r][k] = dst.copy()
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
    """numpy's left fold in rank order: ``acc = x_0; ufunc(acc, x_j, out=acc)``."""
    want = inputs[0].copy()
    for x in inputs[1:]:
        UFUNC[op](want, x, out=want)
    return want


@pytest.mark.parametrize("single", [None, "slice", "whole"])
@pytest.mark.parametrize("p", [1, 2, 3, 4])
@pytest.mark.parametrize("op", shm.OPS)
def test_threads_as_ranks_get_rank_order_bits(p, op, single):
    """Every dtype, counts around p and a long one, out of place and in place (the single
    copy's whole mode falls back to slices in place): numpy's rank-order bits everywhere, NaNs
    included for max and min."""
    rng = np.random.default_rng(p)
    for dtype in shm.DTYPES:
        for count in sorted({0, 1, p - 1, p + 1, 7, 1000}):
            if np.dtype(dtype).kind == "f":
                inputs = [(rng.standard_normal(count) * (1 if op == "prod" else 1e3))
                          .astype(dtype) for _ in range(p)]
                if op in ("max", "min") and count > 3:
                    for r, x in enumerate(inputs):
                        x[r % count] = np.nan       # NaN against numbers, NaN against NaN
                        x[3] = np.nan
            else:
                inputs = [rng.integers(-3, 4, count).astype(dtype) for _ in range(p)]
            want = rank_order(inputs, op)
            for inplace in (False, True):
                outs = run_ranks(inputs, op, chunk=5 + p, calls=3, single=single,
                                 inplace=inplace)
                for r in range(p):
                    for k in range(3):
                        assert outs[r][k].tobytes() == want.tobytes(), \
                            f"{dtype} count={count} rank {r} call {k} in place {inplace}"


def test_many_chunks_both_yield_policies():
    """A long run at p = 3 and 4: 2,000 chunks per call, the buffers reused 1,000 times each."""
    for p in (3, 4):
        rng = np.random.default_rng(7)
        inputs = [rng.standard_normal(20_000) for _ in range(p)]
        want = np.add.reduce(np.stack(inputs), axis=0)
        for yield_after in (0.0, shm.YIELD_AFTER):
            outs = run_ranks(inputs, "sum", chunk=10, calls=2, yield_after=yield_after)
            assert all(o.tobytes() == want.tobytes() for ranks in outs for o in ranks)


def test_flags_are_acquire_loads_and_release_stores():
    """The compiled code reads each flag with ``load atomic ... acquire`` and writes it with
    ``store atomic ... release`` -- not plain loads that LLVM could hoist out of the spin."""
    f64, i64 = types.Array(types.float64, 1, "C"), types.int64
    flags = types.Array(types.int64, 1, "C")
    wait = njit(shm._missing.py_func)         # fresh, uncached: numba shows a cached one's IR
    wait.compile((flags, i64, i64, i64, i64, types.float64, types.float64))
    run = njit(shm._allreduce.py_func)
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
        node_sums = []
        for node in range(nodes):
            acc = inputs[node * L].copy()
            for j in range(1, L):
                np.add(acc, inputs[node * L + j], out=acc)
            node_sums.append(acc)
        want = node_sums[0].copy()
        for node in range(1, nodes):
            np.add(want, node_sums[node], out=want)
        outs = run_ranks(inputs, "sum", chunk=7 + p, calls=3, nodes=nodes, single=single)
        for r in range(p):
            for k in range(3):
                assert outs[r][k].tobytes() == want.tobytes(), f"count={count} rank {r} call {k}"


def test_size_classes():
    assert shm.size_class(0) == shm.size_class(1) == shm.MIN_BYTES
    assert shm.size_class(shm.MIN_BYTES + 1) == 2 * shm.MIN_BYTES
    assert shm.size_class(1 << 30) == shm.CHUNK_BYTES


def test_cost_formula():
    assert shm.cost(1, 1e6, 1, 1, 1) == 0.0
    # p = 2: 2 alpha + 2 n beta + n/2 gamma
    assert shm.cost(2, 1000.0, 1.0, 0.01, 0.001) == pytest.approx(2 + 20 + 0.5)
    assert shm.bytes_sent(0, 4, 1e6) == 0.0
