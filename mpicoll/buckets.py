"""Gradient buckets: all-reduce gradients in groups while the backward pass is still running.

    b = mpicoll.Buckets(grads, bucket_bytes=25 << 20, op="sum", average=True)   # collective
    for step in ...:
        ...backward, last layer first: write gradient i into grads[i], then b.ready(i)
        b.wait()                      # grads[i] now hold the average over the ranks

    b = mpicoll.Buckets(params, gradient_as_bucket_view=True)     # or: in place, no copies
    ...write gradient i into b.grads[i] (a view into its bucket), then b.ready(i)

PyTorch DDP's design (``torch.nn.parallel.DistributedDataParallel``): the arrays are assigned to
buckets in *reverse* order (the backward pass produces the last layer's gradients first), one
dtype per bucket, each bucket one flat, persistent buffer, of up to ``bucket_bytes`` (small
arrays fused) -- the first bucket only up to ``first_bucket_bytes`` (1 MiB, DDP's
``_DEFAULT_FIRST_BUCKET_BYTES``), so the first gradients leave while the backward pass has most
of its work ahead (an array larger than the cap is a bucket of its own). When every array of a
bucket is ready its all-reduce starts in the progress engine, and it runs while the caller
computes the next gradients. Buckets start in bucket order on every rank even if gradients
become ready in another order (a finished bucket waits for the earlier ones), because every rank
must start the same collectives in the same order.

The arrays given are the gradients: ``ready(i)`` copies array i into its bucket, ``wait()``
copies the result back into it. ``b.grads`` is a read-only tuple of views into the buckets
(rebinding ``b.grads[i]`` or writing into it raises). With ``gradient_as_bucket_view=True``
(DDP's option of that name) ``b.grads[i]`` are writable views into the buckets instead: write
each gradient there, in place, with no copy (the arrays given then only give the shapes, dtypes
and initial values).

The constructor is collective (as DDP's): it checks every argument and makes each bucket's plan
(``mpicoll.plan``, the plain all-reduce's, with ``compress`` as given; its checks are the plan's)
and prepared call (``plan.Prepared``, holding its request) once; each step starts and waits for
that. Each bucket's plan carries everything that changes what a rank sends or computes -- the
bucket's dtype and count, ``op``, ``average``, ``compress``, ``error_feedback``,
``reproducible``, and the whole layout (every bucket's dtype and count, in order: ``group``) --
in the signature whose hash is in its messages' tags, so ranks built with other options (or
``bucket_bytes`` that cut other buckets) never match each other's messages: every rank raises
``ArgumentMismatch`` naming the field, found while they wait (no extra message per step).
A step that fails on one rank -- ``wait()`` with an array never marked ready -- still runs every
bucket (so no rank waits for a missing one), and ``wait()`` agrees, with one small
``MPI_Iallreduce`` started after the last bucket, whether every rank completed its step: if
not, every rank raises ``ValueError`` naming the ranks, and every rank's state is reset for the
next step. A step that raises
(``ready`` or ``wait``) first settles the buckets it started, so the next step starts afresh
(on a communicator the failure broke, its first ``ready`` raises ``CommunicatorBroken``).

Who moves the buckets (``progress``): ``"thread"``, the progress thread, while the caller
computes; ``"caller"``, the caller itself, inside ``ready`` (one look at the buckets in flight,
oldest first) and ``wait`` -- MPI's progress rule, as MPICH moves an ``MPI_Iallreduce`` only
inside MPI calls. ``"auto"`` (the default) is ``"caller"`` where the node has no core to spare
(as many ranks as cores: ``idle.full``), where a progress thread would take its time from the
compute beside it (docs/training.md, "End to end"), and where the engine has no thread
(``MPICOLL_PROGRESS=caller``); else ``"thread"``. ``b.progress`` says which was chosen.

``compress`` and ``error_feedback`` apply per bucket (one ``ErrorFeedback`` residual each).
``average=True`` divides by the number of ranks when a bucket's all-reduce completes (sum of a
floating or complex dtype only). ``reproducible=True`` (or K) sums each bucket as
``mpicoll.allreduce(..., reproducible=True)`` does, with the same bits
(``mpicoll.reproducible.Job``; then ``average`` divides that sum by the number of ranks).
"""

from __future__ import annotations

import zlib
from typing import NoReturn

import numpy as np
from mpi4py import MPI

from . import buffers, compression, idle, ops, plan
from ._runtime.call import Call
from ._runtime.context import attach
from .errors import CommunicatorBroken
from .executors import progress as engine
from .executors.progress import Request
from .reproducible.forms import dispatch, spelled

__all__ = ["Buckets"]


class Buckets:
    """Gradient buckets over ``arrays`` (the gradients); see the module's doc."""

    def __init__(self, arrays, bucket_bytes: int = 25 << 20, *, op="sum", average=True,
                 comm=None, algorithm="auto", compress=None, error_feedback=False,
                 timeout=None, on_timeout=None, validate=None,
                 gradient_as_bucket_view: bool = False, reproducible=False,
                 first_bucket_bytes: int = 1 << 20, progress: str = "auto"):
        arrays = [buffers.array(a, f"arrays[{i}]", writable=True)
                  for i, a in enumerate(_sequence(arrays))]
        if not arrays:
            raise ValueError("Buckets needs at least one array")
        for name, value in (("bucket_bytes", bucket_bytes), ("first_bucket_bytes",
                                                               first_bucket_bytes)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        self.op = ops.name(op)
        if progress not in ("auto", "thread", "caller"):
            raise ValueError(f"progress must be 'auto', 'thread' or 'caller', got {progress!r}")
        if error_feedback and compress is None:
            raise ValueError("error_feedback=True needs a compress= mode")
        # (op, dtype, average, compress, algorithm, reproducible: each bucket's plan checks them)
        self.reproducible = None if reproducible is False else spelled(reproducible)
        self.comm = MPI.COMM_WORLD if comm is None else comm
        self.average, self.algorithm, self.compress = average, algorithm, compress
        self._options = (timeout, on_timeout, validate)
        self._arrays, self._as_view = tuple(arrays), bool(gradient_as_bucket_view)

        # Phase 1: assign arrays to buckets, last array first (DDP's order), one dtype each.
        self.buckets: list[tuple] = []          # the array indices of each bucket, in order
        open_bucket: dict = {}                  # dtype -> (indices, bytes) being filled
        for i in reversed(range(len(arrays))):
            dtype = arrays[i].dtype
            members, nbytes = open_bucket.get(dtype, ([], 0))
            cap = bucket_bytes if self.buckets else min(bucket_bytes, first_bucket_bytes)
            if members and nbytes + arrays[i].nbytes > cap:
                self.buckets.append(tuple(members))
                members, nbytes = [], 0
            open_bucket[dtype] = (members + [i], nbytes + arrays[i].nbytes)
        self.buckets += [tuple(members) for members, _ in open_bucket.values()]
        # every rank must cut the same buckets: their dtypes and counts, in order, are signed
        cut = " ".join(f"{arrays[m[0]].dtype}:{sum(arrays[i].size for i in m)}"
                       for m in self.buckets)
        self._groups = [f"{k + 1}/{len(self.buckets)}:{zlib.crc32(cut.encode()):08x}"
                        for k in range(len(self.buckets))]

        # Phase 2: one flat buffer per bucket; each array's slice of it.
        self.flat: list[np.ndarray] = []
        self._slots: list = [None] * len(arrays)        # the bucket view of array i
        self._bucket_of = [0] * len(arrays)
        for k, members in enumerate(self.buckets):
            flat = np.zeros(sum(arrays[i].size for i in members), arrays[members[0]].dtype)
            self.flat.append(flat)
            offset = 0
            for i in members:
                view = self._slots[i] = flat[offset:offset + arrays[i].size].reshape(
                    arrays[i].shape)
                view[...] = arrays[i]
                self._bucket_of[i] = k
                offset += arrays[i].size
        self.grads = tuple(self._slots) if self._as_view else tuple(map(_read_only,
                                                                          self._slots))
        self.feedback = [compression.ErrorFeedback(f.size) if error_feedback else None
                         for f in self.flat]

        # Phase 3: each bucket's prepared call (``plan.Prepared``), holding its request, made
        # once, in one call (collective: one call number whatever the buckets, so ranks that
        # cut others still meet in the first step's calls, and find their signatures differ);
        # each start signs its plan's fields (a reproducible sum's plan is its phases', so its
        # start also signs ``average`` and the group)
        self._prepared = []
        with self._call() as call:
            for k, flat in enumerate(self.flat):
                layout = buffers.allreduce(MPI.IN_PLACE, flat)
                if reproducible is not False:
                    if average:
                        plan.check_average(self.op, flat.dtype)
                    job = dispatch("Buckets", "allreduce", reproducible, MPI.IN_PLACE, flat,
                                   op=self.op, algorithm=algorithm, compress=compress,
                                   error_feedback=error_feedback or None, call=call)
                    req = _job_request(job, flat, self._averager(flat) if average else None)
                    self._prepared.append(job.hold(call, layout, req, average=average or None,
                                                   group=self._groups[k]))
                    continue
                p = plan.make(call, "allreduce", algorithm, layout, op=self.op,
                              compress=compress, form="nonblocking", average=average,
                              feedback=bool(error_feedback), group=self._groups[k])
                self._prepared.append(plan.prepare(call, p).hold(call, layout))
        self._ready = np.zeros(len(arrays), bool)
        self._missing = [len(m) for m in self.buckets]
        self._launched = 0
        # Who advances the buckets' requests: the progress thread, or this caller inside
        # ready() and wait() -- where the node has no core to spare (idle.full: as many ranks
        # as cores), since the thread would take its time from the compute beside it
        self.progress = progress if progress != "auto" else \
            "caller" if idle.full() or engine.mode() == "caller" else "thread"
        # the step's agreement (wait): every rank's count of arrays not marked ready, MAX
        self._flags = np.zeros(self.comm.Get_size(), np.int32)
        self._agreement = Request("Buckets' step agreement (MPI_Iallreduce)", result=self._flags,
                                  library=lambda comm: comm.Iallreduce(MPI.IN_PLACE, self._flags,
                                                                       op=MPI.MAX))
        self._agreeing = False

    def __repr__(self) -> str:
        sizes = ", ".join(f"{f.nbytes}" for f in self.flat)
        return f"<Buckets: {len(self.grads)} arrays in {len(self.flat)} buckets of [{sizes}] bytes>"

    def _call(self) -> Call:
        timeout, on_timeout, validate = self._options
        return Call("allreduce", self.algorithm, self.comm, timeout, on_timeout, validate)

    def _averager(self, flat: np.ndarray):
        """A reproducible sum's ``average`` (a plain bucket's divides: ``Prepared.request``)."""
        size = self.comm.Get_size()
        if size == 1:
            return None

        def average():
            np.divide(flat, flat.dtype.type(size), out=flat)
        return average

    def ready(self, i: int) -> None:
        """Array ``i``'s gradient is written; start every bucket that is now complete (in
        bucket order)."""
        if isinstance(i, bool) or not isinstance(i, (int, np.integer)) or not 0 <= i < len(self.grads):
            raise ValueError(f"array index {i!r} out of range 0..{len(self.grads) - 1}")
        if self._ready[i]:
            raise ValueError(f"array {i} was already marked ready this step")
        if not self._as_view:
            np.copyto(self._slots[i], self._arrays[i])
        self._ready[i] = True
        self._missing[self._bucket_of[i]] -= 1
        try:
            while self._launched < len(self.buckets) and self._missing[self._launched] == 0:
                self._launch(self._launched)
                self._launched += 1
            if self.progress == "caller":       # one look at those in flight, oldest first
                for prepared in self._prepared[:self._launched]:
                    prepared.held.drive()
        except BaseException as exc:
            self._failed(exc)

    def wait(self) -> None:
        """Finish every bucket's all-reduce (averaged if asked); then the next step may begin.

        If an array was not marked ready on some rank, every rank raises ``ValueError`` (the
        buckets still ran, with that rank's stale values: discard this step) and the next step
        starts afresh."""
        missing = np.flatnonzero(~self._ready).tolist()
        try:
            while self._launched < len(self.buckets):      # run them all: no rank waits
                self._launch(self._launched)
                self._launched += 1
            self._start_agreement(missing)  # after the last bucket on every rank: same order
            for prepared in self._prepared:
                prepared.wait()
            self._end_agreement()
        except BaseException as exc:
            self._failed(exc)
        self._reset()
        if not self._as_view:
            for view, array in zip(self._slots, self._arrays):
                np.copyto(array, view)
        if self._flags.any():
            mine = f"; here arrays {missing} were not marked ready()" if missing else ""
            raise ValueError(f"Buckets: rank(s) {np.flatnonzero(self._flags).tolist()} did not "
                             f"mark every array ready() this step: its results are not valid on "
                             f"any rank{mine}")

    def _failed(self, exc: BaseException) -> NoReturn:
        """The step raised ``exc``: settle it, and raise ``exc`` -- or, where ``exc`` says the
        communicator is broken, the error of the bucket that broke it (as the other ranks do)."""
        first = self._settle()
        if first is not None and first is not exc and isinstance(exc, CommunicatorBroken):
            raise first from exc
        raise exc

    def _settle(self) -> Exception | None:
        """End the step: wait for the buckets it started -- after a failure that left the
        communicator usable they complete; on a broken one those still in flight are left to
        fail by themselves (the next step raises ``CommunicatorBroken``) -- reset the state for
        the next step, and return the first error of those buckets, if any."""
        broken, first = attach(self.comm).broken, None
        held = [prepared.held for prepared in self._prepared[:self._launched]]
        for req in held + ([self._agreement] if self._agreeing else []):
            if broken and not req.done:
                if self.progress == "caller":       # (nobody else would ever look at it)
                    req.give_up(CommunicatorBroken(f"{req.what}: given up, the communicator "
                                                   f"broke ({broken})"))
                continue
            try:
                req.wait()
            except Exception as exc:        # noqa: BLE001 - returned
                first = first or exc
        self._reset()
        return first

    def _reset(self) -> None:
        self._agreeing = False
        self._ready[:] = False
        self._missing = [len(m) for m in self.buckets]
        self._launched = 0

    def _start_agreement(self, missing: list) -> None:
        """Start the step's agreement: whether every rank marked every array ready (one small
        ``MPI_Iallreduce``, MAX, on mpicoll's duplicate, under the call's deadline). Started
        once the buckets are, it overlaps their waits: a blocking one after them cost a
        synchronisation more per step (~1 ms at 4 ranks on 2 cores)."""
        self._flags[:] = 0
        if self.comm.Get_size() == 1:
            self._flags[0] = len(missing)
            return
        self._flags[self.comm.Get_rank()] = len(missing)
        timeout, on_timeout, _ = self._options
        with Call("allreduce", "mpi", self.comm, timeout, on_timeout, None) as call:
            self._agreement.start(call, call.open().traffic, keep=self.progress == "caller")
            self._agreeing = True

    def _end_agreement(self) -> None:
        if self._agreeing:
            self._agreement.wait()
            self._agreeing = False

    def _launch(self, k: int) -> None:
        with self._call() as call:
            self._prepared[k].start(call, self.feedback[k], keep=self.progress == "caller")


def _job_request(job, flat: np.ndarray, on_done):
    """A request running a reproducible sum's ``Job`` whole, on the call that starts it."""
    req = Request(f"allreduce {job.plan.describe()}", result=flat, on_done=on_done,
                  deferred=lambda watch: job.run(watch, req.call))
    return req


def _read_only(view: np.ndarray) -> np.ndarray:
    """A read-only view of ``view``: where the arrays given are the gradients, writing into the
    bucket directly would be overwritten by ``ready``'s copy, so it raises instead."""
    out = view.view()
    out.flags.writeable = False
    return out


def _sequence(arrays) -> list:
    """``arrays`` as a list; a clear error for something that is not a sequence of arrays."""
    try:
        return list(arrays)
    except TypeError:
        raise TypeError(f"Buckets needs a sequence of arrays, got {type(arrays).__name__}") \
            from None
