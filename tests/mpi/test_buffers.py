"""Buffers other than numpy arrays under MPI: ``array.array``, ``memoryview``, an object with only
``__dlpack__`` and one with only ``__array_interface__``, as sendbuf and recvbuf of every
algorithm of every collective, blocking, nonblocking and persistent: the exact result lands in
the caller's memory (one rank at a time: tests/unit/test_buffers.py)."""

import array

import numpy as np
import pytest
from mpi4py import MPI

import mpicoll
from mpicoll._runtime.context import state
from mpicoll.registry import COLLECTIVES
from mpicoll.testing import agree, exact_input, exact_result

pytestmark = [pytest.mark.mpi, pytest.mark.timeout(300), pytest.mark.rank_counts(1, 2, 4)]


class DLPackOnly:
    def __init__(self, arr):
        self._arr = arr

    def __dlpack__(self, **kwargs):
        return self._arr.__dlpack__(**kwargs)

    def __dlpack_device__(self):
        return self._arr.__dlpack_device__()


class ArrayInterfaceOnly:
    def __init__(self, arr):
        self._arr = arr
        self.__array_interface__ = arr.__array_interface__


def _array_array(a):
    buf = array.array("d", a.tolist())
    return buf, np.asarray(memoryview(buf))


# kind -> make(float64 values) = (the object to pass, a numpy view of its memory)
KINDS = {"array.array": _array_array,
         "memoryview": lambda a: (memoryview(a), a),
         "DLPack-only": lambda a: (DLPackOnly(a), a),
         "__array_interface__-only": lambda a: (ArrayInterfaceOnly(a), a)}


@pytest.mark.parametrize("kind", KINDS)
def test_allreduce_every_algorithm_and_form(comm, kind):
    size, rank = comm.Get_size(), comm.Get_rank()
    make = KINDS[kind]
    n = 37
    want = exact_result(size, n, np.float64, "sum")
    for algorithm in COLLECTIVES["allreduce"]:
        forms = {
            "blocking": lambda s, r: mpicoll.allreduce(s, r, algorithm=algorithm, comm=comm),
            "nonblocking": lambda s, r: mpicoll.iallreduce(s, r, algorithm=algorithm,
                                                           comm=comm).wait(),
            "persistent": lambda s, r: mpicoll.allreduce_init(s, r, algorithm=algorithm,
                                                              comm=comm)(),
        }
        if COLLECTIVES["allreduce"][algorithm].has("shared-memory"):
            if len(state(comm).real_nodes) > 1:
                continue                    # one node only (refused: test_shm.py)
            del forms["nonblocking"]        # shm has no nonblocking form (refused, tested)
        for form, run in forms.items():
            for in_place in (False, True):
                x = exact_input(rank, n, np.float64, "sum")
                if in_place:
                    obj, memory = make(x)
                    result = run(MPI.IN_PLACE, obj)
                else:
                    (send, _), (obj, memory) = make(x), make(np.zeros(n))
                    result = run(send, obj)
                agree(comm, np.shares_memory(result, memory) and np.array_equal(memory, want),
                      f"{kind} {algorithm} {form} in_place={in_place}: {memory} != {want}")


@pytest.mark.parametrize("kind", KINDS)
def test_the_other_collectives(comm, kind):
    size, rank = comm.Get_size(), comm.Get_rank()
    make = KINDS[kind]
    n = 5
    for algorithm in COLLECTIVES["reduce_scatter_block"]:
        send, _ = make(exact_input(rank, n * size, np.float64, "max"))
        out, memory = make(np.zeros(n))
        mpicoll.reduce_scatter_block(send, out, op="max", algorithm=algorithm, comm=comm)
        want = exact_result(size, n * size, np.float64, "max")[rank * n:(rank + 1) * n]
        agree(comm, np.array_equal(memory, want), f"reduce_scatter_block {algorithm}")
    for algorithm in COLLECTIVES["allgather"]:
        send, _ = make(exact_input(rank, n, np.float64, "sum"))
        out, memory = make(np.zeros(n * size))
        mpicoll.allgather(send, out, algorithm=algorithm, comm=comm)
        want = np.concatenate([exact_input(r, n, np.float64, "sum") for r in range(size)])
        agree(comm, np.array_equal(memory, want), f"allgather {algorithm}")
    for algorithm in COLLECTIVES["bcast"]:
        for root in range(size):
            want = exact_input(root, n, np.float64, "sum")
            buf, memory = make(want.copy() if rank == root else np.zeros(n))
            mpicoll.ibcast(buf, root, algorithm=algorithm, comm=comm).wait()
            agree(comm, np.array_equal(memory, want), f"ibcast {algorithm} root {root}")
