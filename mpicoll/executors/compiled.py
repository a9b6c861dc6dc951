"""The compiled executor: the whole step loop of a schedule in one numba (nopython) function.

It runs what ``executors.python`` runs -- per step: post the receives (reduced ones into scratch,
copied ones straight into the buffer), then the sends, wait for all of them, then reduce the
scratch into the buffer -- but without a Python round-trip per step or per transfer:

* the schedule is one int64 array, ``Schedule.table`` (a row per transfer, computed once per
  schedule and cached on it), with large messages split into segments and steps into rounds
  whose transfers overlap the reduction of the round before (``segments.plan``);
* the transfers call libmpi's ``MPI_Irecv`` / ``MPI_Isend`` / ``MPI_Waitall`` directly, on
  mpicoll's private duplicate of the communicator, through its C handle;
* the reductions call the kernels of ``mpicoll.kernels`` (the same loops: the same bits),
  through their addresses (``kernels.entry_points``), so the loop is compiled once per storage
  dtype with no kernel inside it, whatever the op.

Calling libmpi from numba. The addresses of those functions come from the library mpi4py has
loaded (``ctypes.CDLL(MPI.__file__)``: a symbol lookup through mpi4py's own extension module
finds the libmpi it was linked with, whatever its file name; that library's
``MPI_Get_library_version`` must give mpi4py's string, else the Python executor runs); they are
registered with LLVM (``llvmlite.binding.add_symbol``) under the names that
``types.ExternalFunction`` declares, so compiled code refers to them by name and numba's on-disk
cache stays valid across processes (a ctypes function pointer would be frozen into the code as
an address, which numba refuses to cache). Handle types come from mpi4py's sizes: MPICH's
handles are C ``int``s, Open MPI's are pointers. The request array has the handle's width, so a
cache compiled for one library is never loaded for the other (numba keys its cache on the
argument types). mpi4py returns MPICH's communicator handles sign-extended to an unsigned 64-bit
value (``0xffffffff84000000``); they are passed as the signed 32-bit value they are: a Python
int above 2**63 would be typed ``uint64`` by numba's dispatcher, which is far slower, and is not
the C type anyway.

Timeouts. With a ``watch`` the loop polls ``MPI_Testall`` -- its first ``BUSY_POLLS`` polls of a
step back to back, as ``MPI_Waitall`` would, then calling ``sched_yield`` between polls, as the
Watch does, so that a rank sharing a core with the one it waits for does not hold the core for
a whole time slice -- until ``MPI_Wtime`` (read every ``CLOCK_POLLS`` polls) passes the end of a
short spin (``SPIN_SECONDS``; 20 us when the node's ranks outnumber the cores, ``mpicoll/idle.py``;
at most the call's deadline), then returns the row of the step it is in;
Python hands that step's requests to the ``Watch``, which polls on (sleeping, and answering a
roll call another rank starts) and raises ``CollectiveTimeout`` naming the step and the missing
ranks; if the step completes, the loop is entered again to reduce it and go on.

``MPICOLL_EXECUTOR=python|compiled`` forces either executor; unset, the compiled one is used
where it can be set up, else the Python one with a one-line notice.
"""

from __future__ import annotations

import ctypes
import sys
import threading
import time
from dataclasses import dataclass
from typing import Callable

import numpy as np
from mpi4py import MPI
from mpi4py.util import dtlib

from .. import idle, kernels, settings
from .._runtime import loading
from ..schedule import Schedule
from . import python as python_executor
from . import segments

__all__ = ["Executor", "execute", "execute_python", "choose", "available", "Bound", "Reusable",
           "scratch_elements"]

# ----------------------------------------------------------------------------- libmpi

_MPI_FUNCTIONS = ("MPI_Irecv", "MPI_Isend", "MPI_Waitall", "MPI_Testall", "MPI_Wtime")
_SYMBOL = "mpicoll_{}"          # the names the compiled code calls them by
HANDLE = np.dtype(np.int32) if MPI._sizeof(MPI.Comm) == 4 else np.dtype(np.intp)


def _handle(obj) -> int:
    """An MPI handle as the C value it is (MPICH: a signed int)."""
    h = MPI._handleof(obj)
    return ctypes.c_int32(h).value if HANDLE.itemsize == 4 else ctypes.c_ssize_t(h).value


def _setup() -> str | None:
    """Register libmpi's functions with LLVM; the reason it can't be done, or None."""
    if MPI._sizeof(MPI.Request) != HANDLE.itemsize or MPI._sizeof(MPI.Datatype) != HANDLE.itemsize:
        return "communicator, datatype and request handles differ in size in this MPI library"
    try:
        import llvmlite.binding as llvm
        lib = ctypes.CDLL(MPI.__file__)     # mpi4py's extension: its symbols, then libmpi's
        if _library_version(lib).strip() != MPI.Get_library_version().strip():
            return "the libmpi found through mpi4py's module is not the one mpi4py calls"
        for name in _MPI_FUNCTIONS:
            llvm.add_symbol(_SYMBOL.format(name), ctypes.cast(getattr(lib, name),
                                                              ctypes.c_void_p).value)
        llvm.add_symbol(_SYMBOL.format("sched_yield"),
                        ctypes.cast(ctypes.CDLL(None).sched_yield, ctypes.c_void_p).value)
    except (OSError, AttributeError, ImportError) as error:
        return f"libmpi's functions not found through mpi4py ({error})"
    return None


def _library_version(lib: ctypes.CDLL) -> str:
    """``MPI_Get_library_version`` of ``lib`` (callable before MPI_Init): the check that the
    functions found are those of the library mpi4py runs on."""
    text, length = ctypes.create_string_buffer(MPI.MAX_LIBRARY_VERSION_STRING), ctypes.c_int(0)
    lib.MPI_Get_library_version.argtypes = (ctypes.c_char_p, ctypes.POINTER(ctypes.c_int))
    if lib.MPI_Get_library_version(text, ctypes.byref(length)) != 0:
        return ""
    return text.raw[:length.value].decode(errors="replace")


_unavailable = _setup()

from numba import from_dtype, njit, types  # noqa: E402  (after the symbols exist)

_h = types.int32 if HANDLE.itemsize == 4 else types.intp   # MPI_Comm, MPI_Datatype
_i, _p = types.int32, types.intp                           # int, any pointer
_irecv = types.ExternalFunction(_SYMBOL.format("MPI_Irecv"), _i(_p, _i, _h, _i, _i, _h, _p))
_isend = types.ExternalFunction(_SYMBOL.format("MPI_Isend"), _i(_p, _i, _h, _i, _i, _h, _p))
_waitall = types.ExternalFunction(_SYMBOL.format("MPI_Waitall"), _i(_i, _p, _p))
_testall = types.ExternalFunction(_SYMBOL.format("MPI_Testall"), _i(_i, _p, _p, _p))
_wtime = types.ExternalFunction(_SYMBOL.format("MPI_Wtime"), types.float64())
_sched_yield = types.ExternalFunction(_SYMBOL.format("sched_yield"), _i())    # libc's


_SIZE_T = (1 << 64) - 1   # mpi4py takes handles as size_t (MPICH's sign-extended)
DONE = -1               # _loop's result when every step is complete; >= 0: a pending step's row
SPIN_SECONDS = 0.01     # with a deadline: poll this long in the loop, then let the Watch poll
CROWDED_SPIN_SECONDS = 20e-6    # ... this long in a crowded process (``idle.crowded``: the Watch
                                # then naps: the rank waited for needs the core)
BUSY_POLLS = 64         # ... the first polls of a step back to back (as MPI_Waitall), then yielding
CLOCK_POLLS = 16        # ... reading MPI_Wtime every 16th poll only

# ----------------------------------------------------------------------------- the loop


@njit(cache=True, nogil=True)
def _loop(buf, src, scratch, table, resume, requests, work, comm, datatype, tag, kernel, combiner,
          spin_until):
    """Run the rounds of ``table`` (``segments.COLUMNS``: a row per segment) from row ``resume``
    on; return DONE, the first row of a round still pending at ``spin_until`` (MPI_Wtime; <= 0:
    wait without a deadline), or -2 - an MPI error code. With ``resume`` >= 0 the round at that
    row was posted and completed already (by the Watch), and the next round of its step posted:
    it is only reduced. ``work`` (int64) holds the Testall flag, then the statuses. ``kernel``,
    ``combiner``: the op's kernels (``kernels.entry_points``).

    ``src``: the input, out of place (else ``buf`` itself). A row of column ``input`` touches a
    slice no earlier step wrote (``Schedule.first_touch``), whose input ``buf`` does not hold:
    a send of it reads ``src``, a reduction into it computes ``buf = op(src, incoming)`` (or
    ``op(incoming, src)``) with ``kernels.combine_at``, one pass where the copy in and the
    reduction made two.

    A round is the rows of one step with one round number (the rows its wait completes). The
    rows with post round 0 are posted when the step starts, those with post round r + 1 before
    round r is waited for and reduced, so that their transfers overlap that reduction
    (``segments``). Unsegmented, every step is one round, all posted when it starts."""
    nrows = table.shape[0]
    itemsize = buf.itemsize
    apart = src.ctypes.data != buf.ctypes.data     # out of place: the input is not in buf
    i = max(resume, 0)
    first = i                       # the step's first row
    while first > 0 and table[first - 1, 0] == table[i, 0]:
        first -= 1
    while i < nrows:
        step, rnd = table[i, 0], table[i, 6]
        if rnd == 0:
            first = i
        end = i
        while end < nrows and table[end, 0] == step and table[end, 6] == rnd:
            end += 1
        last = end                  # the step's end
        while last < nrows and table[last, 0] == step:
            last += 1
        n = end - i
        if resume < 0 or i != resume:
            # post: the step's rows of post round 0 when it starts, and those of the next round;
            # receives (reduced ones into scratch) and sends, each in table order
            for k in range(first, last):
                if table[k, 8] != rnd + 1 and (rnd > 0 or table[k, 8] != 0):
                    continue
                peer, lo, hi, kind, at = table[k, 1], table[k, 2], table[k, 3], \
                    table[k, 4], table[k, 5]
                req = requests.ctypes.data + table[k, 7] * requests.itemsize
                if kind == 0:
                    base = src.ctypes.data if apart and table[k, 10] else buf.ctypes.data
                    err = _isend(base + lo * itemsize, hi - lo, datatype, peer, tag, comm, req)
                elif kind == 1:
                    err = _irecv(buf.ctypes.data + lo * itemsize, hi - lo, datatype, peer, tag,
                                 comm, req)
                else:
                    err = _irecv(scratch.ctypes.data + at * itemsize, hi - lo, datatype, peer,
                                 tag, comm, req)
                if err != 0:
                    return -2 - err
            # wait for this round: blocking, or polled until the spin ends
            reqs = requests.ctypes.data + table[i, 7] * requests.itemsize
            if spin_until <= 0.0:
                err = _waitall(n, reqs, work.ctypes.data + 8)
            else:
                work[0] = 0
                err = _testall(n, reqs, work.ctypes.data, work.ctypes.data + 8)
                polls = 0
                while err == 0 and work[0] == 0:
                    polls += 1
                    if polls > BUSY_POLLS:  # let the rank we wait for run, if it shares our core
                        _sched_yield()
                    if polls % CLOCK_POLLS == 0 and _wtime() > spin_until:
                        return i
                    err = _testall(n, reqs, work.ctypes.data, work.ctypes.data + 8)
            if err != 0:
                return -2 - err
        # reduce: acc = op(acc, incoming), or op(incoming, acc) for a left operand (kinds 3
        # and 5); acc is buf[lo:hi], or the next receive's segment in scratch (kinds 4 and 5)
        for k in range(i, end):
            kind = table[k, 4]
            if kind < 2:
                continue
            lo, hi, at, into = table[k, 2], table[k, 3], table[k, 5], table[k, 9]
            incoming = scratch[at:at + hi - lo]
            left = kind % 2 == 1
            if apart and table[k, 10]:          # the slice's first write: from the input
                if left:
                    kernels.combine_at(kernel, combiner, buf[lo:hi], incoming, src[lo:hi])
                else:
                    kernels.combine_at(kernel, combiner, buf[lo:hi], src[lo:hi], incoming)
                continue
            acc = buf[lo:hi] if into < 0 else scratch[into:into + hi - lo]
            if left:
                a, b = incoming, acc
            else:
                a, b = acc, incoming
            kernels.reduce_at(kernel, a, b)
            if left:
                acc[:] = incoming
        i = end
    return DONE


# ----------------------------------------------------------------------------- Python side

_ready: set = set()         # dtypes whose _loop is compiled (or loaded) in this process
_notice_given = False


def warmup(dtype: np.dtype) -> None:
    """Compile (or load from numba's disk cache) ``_loop`` for the storage dtype ``dtype``
    (``kernels.storage``), under ``kernels.file_lock`` (one process per machine
    compiles, the others then load). It calls the kernels by address, so one loop serves every
    op of its dtype; a call's compile time is counted against its deadline (``execute``)."""
    if dtype in _ready:
        return
    with kernels.file_lock(f"the compiled executor's loop for {dtype}"):
        _loop.compile((types.Array(from_dtype(dtype), 1, "C"),) * 3 + (
            types.Array(types.int64, 2, "C"), types.int64,
            types.Array(from_dtype(HANDLE), 1, "C"), types.Array(types.int64, 1, "C"),
            types.int64, types.int64, types.int64, types.int64, types.int64, types.float64))
    _ready.add(dtype)


def available() -> str | None:
    """None if the compiled executor can run here, else the reason it can't."""
    return _unavailable


def choose() -> "Executor":
    """The executor to use (``execute`` or ``execute_python``): ``MPICOLL_EXECUTOR``'s, or the
    compiled one where it is available (a one-line notice on stderr the first time it is
    not)."""
    global _notice_given
    forced = settings.get("MPICOLL_EXECUTOR")
    if forced == "python":
        return execute_python
    if _unavailable is None:
        return execute
    if forced == "compiled":
        raise RuntimeError(f"MPICOLL_EXECUTOR=compiled: the compiled executor can't run here: "
                           f"{_unavailable}")
    if not _notice_given:
        _notice_given = True
        sys.stderr.write(f"mpicoll: using the Python executor: {_unavailable}\n")
    return execute_python


_datatypes = {}


def _datatype(dtype: np.dtype) -> int:
    """The MPI datatype handle of the storage dtype ``dtype`` (mpi4py's own mapping; the half
    types travel as uint16, ``kernels.storage``: MPI never reduces them here)."""
    h = _datatypes.get(dtype)
    if h is None:
        h = _datatypes[dtype] = _handle(dtlib.from_numpy_dtype(dtype))
    return h


_op_kernels_found = {}


def _op_kernels(op: str, dtype: np.dtype, watch=None) -> tuple:
    """``_loop``'s kernels for ``op`` on ``dtype`` (``kernels.entry_points``; compiled or loaded
    first under ``watch``'s deadline, if any), and the storage dtype to view the buffers as
    (None: the dtype itself); TypeError for a pair MPI does not allow."""
    found = _op_kernels_found.get((op, dtype))
    if found is None:
        kernels.check(op, dtype)
        loading.load(lambda: kernels.warmup(op, dtype), watch)     # local work (issue #22)
        store = kernels.storage(dtype)
        found = _op_kernels_found[op, dtype] = (kernels.entry_points(op, dtype),
                                                None if store == dtype else store)
    return found


# Per thread: the progress thread runs a nonblocking call whole (a deferred request) while
# the caller's thread runs a blocking one; sharing the handles mixed their requests up.
_mine = threading.local()


_STATUS_WORDS = -(-MPI._sizeof(MPI.Status) // 8)       # int64 words per MPI_Status


def _buffers(plan: segments.SegmentTable) -> tuple:
    """The request handles (``plan.requests``) and the Testall flag + statuses (``plan.width``)
    ``plan`` needs, reused across this thread's calls (grown to the widest table seen)."""
    mine = _mine.__dict__
    requests, work = mine.get("requests"), mine.get("work")
    if requests is None or requests.size < plan.requests:
        requests = mine["requests"] = np.empty(max(plan.requests, 1), HANDLE)
    if work is None or work.size < 1 + plan.width * _STATUS_WORDS:
        work = mine["work"] = np.zeros(1 + plan.width * _STATUS_WORDS, np.int64)
    return requests, work


def scratch_elements(executor: "Executor", schedule: Schedule, itemsize: int) -> int:
    """The scratch ``executor`` needs for ``schedule``: for the compiled one, its segmented
    plan's (two segments per pipelined receive, ``segments``), else the largest step's."""
    whole = schedule.scratch_elements
    if not executor.compiled or whole * itemsize < 2 * segments.MIN_SEGMENT:
        return whole            # (small: never more than the segmented plan needs)
    return segments.plan(schedule, itemsize).scratch


class Bound:
    """One schedule bound to its buffers, communicator, tag and op: everything ``_loop`` needs,
    looked up and allocated once (a persistent collective keeps one), so that ``run`` is the
    loop and the byte counters."""

    __slots__ = ("schedule", "args", "traffic", "sent", "received", "messages", "src", "kept")

    def __init__(self, schedule: Schedule, buf: np.ndarray, comm: MPI.Comm, *, op: str, tag: int,
                 scratch: np.ndarray, traffic: dict, src: np.ndarray | None = None,
                 kept: tuple | None = None):
        (kernel, combiner), view = _op_kernels(op, buf.dtype)
        if view is not None:
            buf, scratch = buf.view(view), scratch.view(view)
            src = None if src is None else src.view(view)
        self.src, self.kept = src, kept         # out of place: the input (``Reusable.run``)
        warmup(buf.dtype)
        plan = segments.plan(schedule, buf.itemsize)
        _check_scratch(scratch, plan)
        table = plan.table
        requests = np.empty(max(plan.requests, 1), HANDLE)
        work = np.zeros(1 + plan.width * _STATUS_WORDS, np.int64)
        self.schedule, self.traffic = schedule, traffic
        self.args = (buf, scratch if scratch.size else np.empty(1, buf.dtype), table, requests,
                     work, _handle(comm), _datatype(buf.dtype), tag, kernel, combiner)
        sent, received, self.messages = schedule.totals
        self.sent, self.received = sent * buf.itemsize, received * buf.itemsize

    def run(self, watch=None, tag: int | None = None) -> None:
        """Run the schedule once (under ``watch``'s deadline, if any; ``tag``: another call's
        than the one it was bound in, as ``Buckets`` start a reproducible sum each step)."""
        buf, scratch, table, requests, work, comm, datatype, bound_tag, kernel, combiner = \
            self.args
        tag = bound_tag if tag is None else tag
        src = buf if self.src is None else _copy_first(self.schedule, buf, self.src, self.kept)
        if watch is not None:
            return _run_watched(self.schedule, watch, self.traffic, buf, src, scratch, table,
                                requests, work, comm, datatype, tag, kernel, combiner)
        result = _loop(buf, src, scratch, table, -1, requests, work, comm, datatype, tag, kernel,
                       combiner, 0.0)
        if result != DONE:
            raise MPI.Exception(-2 - result)
        _counted(self.traffic, self.sent, self.received, self.messages)


class Reusable:
    """One schedule bound to everything but its buffer and tag -- the op, the scratch, the
    communicator, the request and status arrays -- for a plain call that comes again with the
    same arguments (``plan.Prepared`` keeps one): ``run`` is then the loop and the counters.

    Under a deadline (``timeout`` seconds from the call) no ``Watch`` is made unless a round
    outlasts the loop's spin: the deadline is a time of ``MPI_Wtime``'s clock, read once, and
    ``make_watch(seconds_left)`` makes the Watch only then, which ``_run_watched`` hands the
    pending round to."""

    __slots__ = ("schedule", "view", "scratch", "rest", "kernels", "traffic", "totals")

    def __init__(self, schedule: Schedule, dtype: np.dtype, comm: MPI.Comm, *, op: str,
                 scratch: np.ndarray, traffic: dict):
        kernel_pair, view = _op_kernels(op, dtype)
        if view is not None:
            scratch = scratch.view(view)
        dtype = scratch.dtype
        warmup(dtype)
        plan = segments.plan(schedule, dtype.itemsize)
        _check_scratch(scratch, plan)
        requests = np.empty(max(plan.requests, 1), HANDLE)
        work = np.zeros(1 + plan.width * _STATUS_WORDS, np.int64)
        self.schedule, self.view, self.kernels, self.traffic = schedule, view, kernel_pair, traffic
        self.scratch = scratch if scratch.size else np.empty(1, dtype)
        self.rest = (plan.table, requests, work, _handle(comm), _datatype(dtype))
        self.totals = tuple(n * dtype.itemsize for n in schedule.totals[:2]) + (
            schedule.totals[2],)

    def run(self, buf: np.ndarray, tag: int, timeout: float | None = None,
            make_watch=None, src: np.ndarray | None = None, kept: tuple | None = None) -> None:
        """Run the schedule on ``buf`` with ``tag``; ``timeout`` (seconds) or None. ``src``:
        out of place, the input (flat), which ``buf`` need not hold: the loop reads it where
        no step wrote yet, and the pieces ``first_touch.copies(*kept)`` names are copied in
        first (``kept``: the ``(lo, hi)`` of ``buf`` the call keeps)."""
        if self.view is not None:
            buf = buf.view(self.view)
        if src is None:
            src = buf
        else:
            src = _copy_first(self.schedule, buf, src if self.view is None else
                              src.view(self.view), kept)
        table, requests, work, comm, datatype = self.rest
        if timeout is None:
            spin_until = 0.0
        else:
            start = MPI.Wtime()
            spin = _spin()
            spin_until = start + (spin if spin < timeout else timeout)
        kernel, combiner = self.kernels
        result = _loop(buf, src, self.scratch, table, -1, requests, work, comm, datatype, tag,
                       kernel, combiner, spin_until)
        if result == DONE:
            _counted(self.traffic, *self.totals)
            return
        if result < DONE:
            raise MPI.Exception(-2 - result)
        _run_watched(self.schedule, make_watch(start + timeout - MPI.Wtime()), self.traffic, buf,
                     src, self.scratch, *self.rest[:3], comm, datatype, tag, kernel, combiner,
                     result)


def _spin() -> float:
    """How long the loop polls before the Watch does: ``SPIN_SECONDS``, at most
    ``CROWDED_SPIN_SECONDS`` in a crowded process."""
    return min(SPIN_SECONDS, CROWDED_SPIN_SECONDS) if idle.crowded() else SPIN_SECONDS


def _copy_first(schedule: Schedule, buf: np.ndarray, src: np.ndarray, kept: tuple) -> np.ndarray:
    """Out of place: copy into ``buf`` what the loop can't read from ``src`` (the pieces of
    ``first_touch.copies(*kept)``, ``kept`` by default all of ``buf``: at one rank the kept
    part whole, else nothing for the registered algorithms); returns ``src``."""
    touch = schedule.first_touch
    if kept is None:
        if buf.size <= touch.whole:         # (an all-reduce at two ranks or more)
            return src
        kept = (0, buf.size)
    for lo, hi in touch.copies(*kept):
        buf[lo:hi] = src[lo:hi]
    return src


def _run_watched(schedule, watch, traffic, buf, src, scratch, table, requests, work, comm,
                 datatype, tag, kernel, combiner, resume=-1) -> None:
    """``_loop`` under ``watch``'s deadline: a step still pending after the spin goes to the
    Watch (which raises CollectiveTimeout past the deadline), then the loop goes on.
    ``resume`` >= 0: the loop already ran and left that row's round pending (``Reusable``)."""
    nsteps, result = len(schedule.plan), resume
    offset = MPI.Wtime() - time.monotonic()        # the Watch's clock to MPI_Wtime's
    while True:
        if resume < 0:
            deadline = watch.deadline + offset
            spin_until = min(MPI.Wtime() + _spin(), deadline)
            result = _loop(buf, src, scratch, table, result, requests, work, comm, datatype,
                           tag, kernel, combiner, spin_until)
            if result >= 0 and MPI.Wtime() >= deadline:
                # past the deadline by MPI_Wtime: make sure the Watch's clock agrees (the two
                # were matched to a microsecond or so), so it reports its own timeout
                watch.deadline = min(watch.deadline, time.monotonic() - 1e-6)
            if result == DONE:
                sent, received, messages = schedule.totals
                _counted(traffic, sent * buf.itemsize, received * buf.itemsize, messages)
                return
            if result < DONE:
                raise MPI.Exception(-2 - result)
        resume = -1
        step, rnd = int(table[result, 0]), table[result, 6]
        end = result
        while end < len(table) and table[end, 0] == step and table[end, 6] == rnd:
            end += 1
        rows = table[result:end]            # the round _loop waits for (segments.COLUMNS)
        pending = [MPI.Request.fromhandle(int(requests[slot]) & _SIZE_T) for slot in rows[:, 7]]
        try:
            watch.wait(pending, step, nsteps, [int(peer) for peer in rows[:, 1]])
        except BaseException:
            watch.abandoned += [buf, src, scratch, requests, work]  # MPI may still use them
            if _mine.__dict__.get("requests") is requests:      # so the next call gets new ones
                _mine.__dict__.clear()
            _count(schedule.table, step + 1, buf.itemsize, traffic)
            raise


def _check_scratch(scratch: np.ndarray, plan: segments.SegmentTable) -> None:
    """The loop receives into scratch through raw pointers: it must be large enough."""
    if scratch.size < plan.scratch:
        raise ValueError(f"scratch of {scratch.size} elements, the plan needs {plan.scratch} "
                         "(compiled.scratch_elements)")


def _counted(traffic: dict, sent: int, received: int, messages: int) -> None:
    """Add what the loop posted -- bytes sent and received, messages sent -- to the counters:
    the one place the compiled executor counts."""
    traffic["bytes_sent"] += sent
    traffic["bytes_received"] += received
    traffic["messages_sent"] += messages


def _count(table: np.ndarray, steps: int, itemsize: int, traffic: dict) -> None:
    """Add the transfers of the first ``steps`` steps to the byte counters."""
    rows = table[table[:, 0] < steps]
    sizes = (rows[:, 3] - rows[:, 2]) * itemsize
    sends = rows[:, 4] == 0
    _counted(traffic, int(sizes[sends].sum()), int(sizes[~sends].sum()), int(sends.sum()))


def _execute(schedule: Schedule, buf: np.ndarray, comm: MPI.Comm, *, op: str, tag: int,
             scratch: np.ndarray, traffic: dict, watch=None, src: np.ndarray | None = None,
             kept: tuple | None = None) -> None:
    """Run ``schedule`` on the flat array ``buf`` over ``comm`` (as ``executors.python.execute``,
    the op by name); add to the ``traffic`` counters. ``src``, ``kept``: out of place, the
    input, which ``buf`` need not hold, and the part of ``buf`` the call keeps
    (``Reusable.run``)."""
    (kernel, combiner), view = _op_kernels(op, buf.dtype, watch)
    if view is not None:
        buf, scratch = buf.view(view), scratch.view(view)
        src = None if src is None else src.view(view)
    if buf.dtype not in _ready:             # local work, under the call's deadline (issue #22)
        loading.load(lambda: warmup(buf.dtype), watch)
    cached = schedule.derived.get(buf.itemsize)       # segments.plan(), the lookup inlined
    plan = cached[1] if cached is not None and cached[0] is segments._rule else \
        segments.plan(schedule, buf.itemsize)
    if scratch.size < plan.scratch:
        _check_scratch(scratch, plan)
    table = plan.table
    requests, work = _buffers(plan)
    if scratch.size == 0:
        scratch = buf[:0]
    src = buf if src is None else _copy_first(schedule, buf, src, kept)
    args = (buf, src, scratch, table, requests, work, _handle(comm), _datatype(buf.dtype), tag,
            kernel, combiner)
    if watch is not None:
        return _run_watched(schedule, watch, traffic, *args)
    result = _loop(*args[:4], -1, *args[4:], 0.0)
    if result != DONE:
        raise MPI.Exception(-2 - result)
    sent, received, messages = schedule.totals
    _counted(traffic, sent * buf.itemsize, received * buf.itemsize, messages)


def _python_bound(schedule: Schedule, flat: np.ndarray, comm: MPI.Comm, *, op: str, tag: int,
                  scratch: np.ndarray, traffic: dict, src=None, kept=None):
    """The Python executor's ``bind``: its ``execute`` on ``flat`` (never reading ``src``)."""
    def run(watch=None, tag_now: int | None = None) -> None:
        python_executor.execute_by_name(schedule, flat, comm, op=op,
                                        tag=tag if tag_now is None else tag_now,
                                        scratch=scratch, traffic=traffic, watch=watch)
    return run


@dataclass(frozen=True, eq=False)
class Executor:
    """An executor of schedules: ``executor(schedule, buf, comm, *, op, tag, scratch, traffic,
    watch=None)`` runs one; ``name`` is the plan's field (``plan.executor``); ``compiled``:
    the compiled loop, which loads its own kernels under the call's deadline and reads an
    out-of-place input itself where no step wrote yet (``src``, ``kept``) instead of a copy;
    ``bind(schedule, flat, comm, *, op, tag, scratch, traffic, src=None, kept=None)`` returns
    ``run(watch=None, tag=None)``, the schedule bound once to all it uses; ``reusable``: the
    class a prepared call reused on new buffers keeps (``Reusable``), None where there is none
    (the cache then keeps no such call)."""

    name: str
    run: Callable
    bind: Callable
    compiled: bool
    reusable: type | None

    def __call__(self, schedule: Schedule, buf: np.ndarray, comm: MPI.Comm, **kwargs) -> None:
        self.run(schedule, buf, comm, **kwargs)


def _compiled_bound(schedule: Schedule, flat: np.ndarray, comm: MPI.Comm, **kwargs):
    return Bound(schedule, flat, comm, **kwargs).run


execute = Executor("compiled", _execute, _compiled_bound, True, Reusable)
execute_python = Executor("python", python_executor.execute_by_name, _python_bound, False, None)
