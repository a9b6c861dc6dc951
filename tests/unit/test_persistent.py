"""Persistent collectives and the executor setting, serially (COMM_SELF); the MPI side is
tests/mpi/test_persistent.py and tests/mpi/test_compiled.py."""

import ctypes

import numpy as np
import pytest
from mpi4py import MPI

import mpicoll
from mpicoll import plan, prepared, settings
from mpicoll.executors import compiled
from mpicoll.schedule import TABLE_KINDS
from mpicoll.testing import environment

COMM = MPI.COMM_SELF


@pytest.mark.timeout(120)
@pytest.mark.parametrize("algorithm", ["auto", "ring", pytest.param("mpi", id="library")])
def test_allreduce_init_repeats_with_new_inputs(algorithm):
    send, recv = np.zeros(5), np.empty(5)
    h = mpicoll.allreduce_init(send, recv, algorithm=algorithm, comm=COMM)
    for k in range(3):
        send[...] = np.arange(5.0) * k
        assert h() is recv
        assert recv.tolist() == (np.arange(5.0) * k).tolist()
    send[...] = 7.0
    h.start()
    assert h.wait() is recv and recv.tolist() == [7.0] * 5


@pytest.mark.timeout(120)
def test_the_other_persistent_collectives_on_one_rank():
    x, out = np.arange(6.0), np.empty(6)
    h = mpicoll.reduce_scatter_block_init(x, out, op="max", comm=COMM)
    x[...] = 3.0
    assert h().tolist() == [3.0] * 6
    g = mpicoll.allgather_init(x, out, comm=COMM)
    x[...] = 4.0
    assert g().tolist() == [4.0] * 6
    b = mpicoll.bcast_init(x, root=0, comm=COMM)
    assert b() is x


@pytest.mark.timeout(120)
def test_start_twice_is_an_error():
    h = mpicoll.allreduce_init(np.ones(2), np.empty(2), comm=COMM)
    h.start()
    with pytest.raises(RuntimeError, match=r"start\(\) called again before wait\(\)"):
        h.start()
    h.wait()
    h.start()
    h.wait()


@pytest.mark.parametrize("args, kwargs, exc, match", [
    (([1.0],), {}, TypeError, "sendbuf must be an array, got list"),
    ((np.arange(3.0), np.zeros(4)), {}, ValueError, "recvbuf has 4 elements, expected 3"),
    ((np.arange(3.0),), {"op": "avg"}, TypeError, "unsupported op 'avg'"),
    ((np.arange(3.0),), {"algorithm": "butterfly"}, ValueError, "unknown allreduce algorithm"),
    ((np.arange(3.0),), {"timeout": -1}, ValueError, "timeout must be a positive number"),
])
def test_allreduce_init_checks_its_arguments(args, kwargs, exc, match):
    with pytest.raises(exc, match=match):
        mpicoll.allreduce_init(*args, comm=COMM, **kwargs)


def test_bcast_init_checks_the_root():
    with pytest.raises(ValueError, match="root 1 out of range for a communicator of size 1"):
        mpicoll.bcast_init(np.ones(2), root=1, comm=COMM)


def test_executor_setting():
    with environment(MPICOLL_EXECUTOR="python"):
        assert compiled.choose() is compiled.execute_python
    with environment(MPICOLL_EXECUTOR="compiled"):
        if compiled.available() is None:
            assert compiled.choose() is compiled.execute
        else:
            with pytest.raises(RuntimeError, match="MPICOLL_EXECUTOR=compiled"):
                compiled.choose()
    with environment(MPICOLL_EXECUTOR="numba"):
        with pytest.raises(ValueError, match="MPICOLL_EXECUTOR must be 'python' or 'compiled', "
                                             "got 'numba'"):
            settings.get("MPICOLL_EXECUTOR")
    assert prepared._execute is None    # settings.reload() made the plan choose again


def test_schedule_table_lists_the_plan():
    """One row per transfer, receives before sends within a step, kinds as named (naive's
    rank 3 of 4: two receives reduced into the next one, as left operands)."""
    from mpicoll.registry import lookup
    for sched in (lookup("allreduce", "recursive_halving").schedule(1, 3, 10),
                  lookup("allreduce", "naive").schedule(3, 4, 10)):
        rows = [tuple(r) for r in sched.table.tolist()]
        expected = []
        for step, (recvs, sends) in enumerate(sched.plan):
            expected += [(step, p, lo, hi, (2 + left + 2 * (into >= 0)) if red else 1, at)
                         for p, lo, hi, red, left, at, into in recvs]
            expected += [(step, p, lo, hi, 0, 0) for p, lo, hi in sends]
        assert rows == expected and len(rows) == sum(len(s) for s in sched.steps)
    assert [row[4] for row in rows[:3]] == [5, 5, 3]
    assert [TABLE_KINDS[k] for k in (0, 3, 5)] == [
        "send", "recv reduce (as left operand)",
        "recv reduce (as left operand) into the next receive"]


def test_fallback_notice_once(monkeypatch, capsys):
    """Where the compiled executor can't run: the Python one, with a one-line notice, once;
    MPICOLL_EXECUTOR=compiled then raises with the reason."""
    monkeypatch.setattr(compiled, "_unavailable", "libmpi's functions not found (test)")
    monkeypatch.setattr(compiled, "_notice_given", False)
    with environment(MPICOLL_EXECUTOR=None):
        assert compiled.choose() is compiled.execute_python
        assert compiled.choose() is compiled.execute_python
    err = capsys.readouterr().err
    assert err == "mpicoll: using the Python executor: libmpi's functions not found (test)\n"
    with environment(MPICOLL_EXECUTOR="compiled"):
        with pytest.raises(RuntimeError, match=r"can't run here: libmpi's functions not found"):
            compiled.choose()


def test_libmpi_is_the_one_mpi4py_runs_on(monkeypatch):
    """The functions come from the libmpi behind mpi4py's own extension module (its version
    string is mpi4py's), with mpi4py's handle width; a library that answers with another
    version string is refused, with the reason."""
    lib = ctypes.CDLL(MPI.__file__)
    assert compiled._library_version(lib).strip() == MPI.Get_library_version().strip()
    assert compiled.HANDLE.itemsize == MPI._sizeof(MPI.Comm) == MPI._sizeof(MPI.Request)
    assert compiled._setup() is None
    monkeypatch.setattr(compiled, "_library_version", lambda lib: "Some Other MPI 1.0")
    assert compiled._setup() == "the libmpi found through mpi4py's module is not the one " \
                                "mpi4py calls"
