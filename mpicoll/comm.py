"""mpi4py's buffer collectives run by mpicoll's algorithms: a drop-in for code written for mpi4py.

    comm = mpicoll.Comm(MPI.COMM_WORLD.Dup())     # or mpicoll.wrap(...)
    comm.Allreduce([sbuf, MPI.DOUBLE], [rbuf, MPI.DOUBLE], op=MPI.SUM)     # mpicoll's allreduce
    comm.algorithm = "ring"                      # every later call that has it (default "auto")
    comm.Get_rank(), comm.Barrier(), comm.allreduce(obj)    # the wrapped communicator's own

``Allreduce``, ``Reduce_scatter_block``, ``Allgather``, ``Bcast``, their nonblocking forms
(``Iallreduce`` ...) and persistent forms (``Allreduce_init`` ...) take mpi4py's arguments and
buffer specs: ``buf``; ``[buf, datatype]``; ``[buf, count]``; ``[buf, count, datatype]``;
``[buf, (count, displ), datatype]``; ``[buf, count, displ, datatype]`` (count and displacement
in elements of the datatype); ``MPI.IN_PLACE`` (or ``None``) as the send buffer. The MPI
datatype says how the bytes are read (``mpi4py.util.dtlib.to_numpy_dtype``), without a copy:
the result lands in the caller's buffer. ``buf`` is anything ``mpicoll.allreduce`` takes: a
numpy array, an object with the buffer protocol, ``__array_interface__`` or ``__dlpack__``.
Without a datatype the buffer's own dtype is used, so a bfloat16 array (which MPI has no
datatype for) works too. Counts that are not given are inferred as mpi4py does: the whole
buffer, split into ``comm.size`` blocks where the call has blocks (``Allgather``'s receive
buffer, ``Reduce_scatter_block``'s send buffer, or its receive buffer in place). As in mpi4py
the blocking calls return None.

``Bcast`` and ``Allgather`` only copy, so they take any datatype (as bytes, or packed with
``MPI_Pack`` when it has holes). In place, ``Reduce_scatter_block`` leaves the rest of the
buffer as it was. ``algorithm`` is a name (each collective that has it runs it, the others
``auto``) or a ``{collective: name}`` mapping.

``comm.reproducible = True`` (or K, the slices per value; default False) makes every float SUM
of ``Allreduce`` and ``Reduce_scatter_block``, in each form, give the same bits whatever the
rank count, algorithm or node layout (``mpicoll.reproducible``). Their other ops and integer
sums are exact already and run as usual; a floating-point PROD raises ``ValueError`` (there is
no reproducible product).

An op, datatype or buffer mpicoll cannot do raises mpicoll's error (``TypeError`` or
``ValueError`` naming it; ``Unsupported`` for a datatype it doesn't reduce or device memory) on
the calling rank, before any communication: there is no silent fall-back to the MPI library.
(``algorithm="mpi"`` runs the library's own collective; so does ``fallback=True`` for what
raises ``Unsupported``, counted in ``Comm.fallbacks``.)

Requests are MPI requests: ``Iallreduce`` (...) returns a ``Request``, an MPI generalized
request that completes with mpicoll's collective, and ``Allreduce_init`` (...) a ``Prequest``,
an MPI persistent request whose ``Start()`` starts the collective and returns at once. ``MPI.Request.Waitall``,
``Testall``, ``Waitany`` ... take them (with mpicoll's progress thread, the default under
``MPI_THREAD_MULTIPLE``; under ``MPICOLL_PROGRESS=caller`` use ``Request.Waitall`` ..., which
move the collectives). docs/buffers.md has the details.
"""

from __future__ import annotations

import collections

from mpi4py import MPI

from . import api, ops, persistent, recovery, registry
from .buffer_specs import (Args, Packed, Unsupported, as_bytes, in_place, message, plain,
                           reduces, reducible)
from .mpi_requests import Prequest, Request

__all__ = ["Comm", "wrap", "Request", "Prequest", "Unsupported"]


# ----------------------------------------------------------------------------- the wrapper

# ----------------------------------------------------------------------------- the wrapper

class Comm:
    """An mpi4py communicator whose buffer collectives mpicoll runs; see the module's doc.

    ``algorithm`` (default ``"auto"``, settable) is used by every call, read as
    ``mpicoll.registry.per_collective`` reads it (the torch backend's ``Options.algorithm``
    too): a name goes to each collective that has an algorithm of that name, and the others
    use ``auto`` (``"recursive_doubling"``: all-reduce and all-gather; reduce-scatter and
    broadcast ``auto``); a mapping (``{"allreduce": "ring", "bcast": "binomial"}``) names them
    one by one (those left out: ``auto``). Every other attribute is the wrapped communicator's
    (``self.comm``). It is not an ``MPI.Comm`` itself: where one is required (another
    library, ``comm=`` of mpicoll's functions), pass ``self.comm``."""

    def __init__(self, comm=None, algorithm="auto", *, fallback: bool = False,
                 reproducible=False):
        if isinstance(comm, Comm):
            comm = comm.comm
        comm = MPI.COMM_WORLD if comm is None else comm
        if not isinstance(comm, MPI.Intracomm) or comm == MPI.COMM_NULL:
            raise TypeError(f"mpicoll.Comm wraps an MPI intracommunicator, got {comm!r}")
        self.comm = comm
        self.algorithm = algorithm
        self.reproducible = reproducible
        self.fallback = bool(fallback)
        self.fallbacks: collections.Counter = collections.Counter()

    @property
    def algorithm(self):
        """The name or mapping given (see the class's doc)."""
        return self._algorithm

    @algorithm.setter
    def algorithm(self, value) -> None:
        self._per = registry.per_collective(value, "mpicoll.Comm")
        self._algorithm = value

    @property
    def reproducible(self):
        """False, True or K: see the module's doc."""
        return self._reproducible

    @reproducible.setter
    def reproducible(self, value) -> None:
        self._reproducible = ops.reproducible_setting(value, "mpicoll.Comm")

    def algorithm_for(self, collective: str) -> str:
        """The algorithm a collective (``"bcast"`` ...) runs with."""
        return self._per[collective]

    def __getattr__(self, name: str):          # only for what this class does not define
        if name in ("comm", "_per", "_algorithm", "_reproducible", "fallback", "fallbacks"):    # not set yet (unpickling, a failed __init__)
            raise AttributeError(name)
        return getattr(self.comm, name)

    def __repr__(self) -> str:
        extra = "" if self._reproducible is False else f" reproducible={self._reproducible!r}"
        return f"<mpicoll.Comm algorithm={self.algorithm!r}{extra} over {self.comm!r}>"

    # what Python looks up on the type, not through __getattr__: as the communicator's
    def __eq__(self, other) -> bool:
        return self.comm == (other.comm if isinstance(other, Comm) else other)

    def __ne__(self, other) -> bool:
        return not self == other

    __hash__ = None             # as mpi4py's communicators

    def __bool__(self) -> bool:
        return bool(self.comm)

    # the buffers of each collective, read as mpi4py reads them (see the module's doc)

    def _how(self, collective: str, args=None, op=None) -> dict:
        how = {"algorithm": self._per[collective], "comm": self.comm}
        if self._reproducible is not False and op is not None:
            how.update(ops.reproducible_for(self._reproducible, args.args[1].dtype,
                                            _op_name(op), "mpicoll.Comm"))
        return how

    def _reduce_args(self, sendbuf, recvbuf) -> Args:
        recv = reducible(message(recvbuf, "recvbuf"), "recvbuf")
        send = MPI.IN_PLACE if in_place(sendbuf) else \
            reducible(message(sendbuf, "sendbuf"), "sendbuf")
        return Args(send, recv)

    def _scatter_args(self, sendbuf, recvbuf) -> Args:
        size = self.comm.Get_size()
        if not in_place(sendbuf):
            return Args(reducible(message(sendbuf, "sendbuf", size), "sendbuf"),
                         reducible(message(recvbuf, "recvbuf"), "recvbuf"))
        # In place: the input is the whole recvbuf (size blocks), the result its first block,
        # the rest left as it was (as MPICH and Open MPI do): buffers.reduce_scatter_block's
        # layout runs on a copy of it and writes back only the first block.
        return Args(MPI.IN_PLACE, reducible(message(recvbuf, "recvbuf", size), "recvbuf"))

    def _gather_args(self, sendbuf, recvbuf) -> Args:
        size = self.comm.Get_size()
        recv = message(recvbuf, "recvbuf", size, copy=True)
        send = MPI.IN_PLACE if in_place(sendbuf) else message(sendbuf, "sendbuf", copy=True)
        if not (isinstance(recv, Packed) or isinstance(send, Packed)):
            if send is MPI.IN_PLACE or send.dtype == recv.dtype or \
                    (reduces(send.dtype) and reduces(recv.dtype)):
                return Args(send, recv)
        before, after = [], []
        if isinstance(send, Packed):
            before.append(send.pack)
        if isinstance(recv, Packed):
            if send is MPI.IN_PLACE:
                before.append(recv.pack)        # this rank's block, packed in place
            after.append(recv.unpack)
        return Args(as_bytes(send), as_bytes(recv), before=before, after=after)

    def _bcast_args(self, buf, root) -> Args:
        msg = message(buf, "buf", copy=True)
        if not isinstance(msg, Packed):
            return Args(msg, root)
        mine = self.comm.Get_rank() == root
        return Args(msg.bytes, root, before=(msg.pack,) if mine else (),
                     after=() if mine else (msg.unpack,))

    def _args(self, method: str, make, *given):
        """``make(*given)``, or None when mpicoll can't run the call and ``fallback`` is on."""
        try:
            return make(*given)
        except Unsupported:
            if not self.fallback:
                raise
            self.fallbacks[method] += 1
            return None

    def _run(self, method: str, fn, make, given: tuple, collective: str, **kwargs) -> None:
        args = self._args(method, make, *given)
        if args is None:
            return getattr(self.comm, method)(*given, **kwargs)
        how = self._how(collective, args, kwargs.get("op"))
        args.before()
        fn(*args.args, **kwargs, **how)
        args.after()

    def _start(self, method: str, fn, make, given: tuple, collective: str, **kwargs):
        args = self._args(method, make, *given)
        if args is None:
            return getattr(self.comm, method)(*given, **kwargs)
        how = self._how(collective, args, kwargs.get("op"))
        return Request._start(lambda *a: fn(*a, **kwargs, **how), args)

    def _init(self, method: str, fn, make, given: tuple, collective: str, **kwargs):
        args = self._args(method, make, *given)
        if args is None:
            return getattr(self.comm, method)(*given, **kwargs)
        return Prequest._make(fn(*args.args, **kwargs,
                                 **self._how(collective, args, kwargs.get("op"))), args)

    # blocking (None, as mpi4py's), nonblocking (Request), persistent (Prequest)

    def Allreduce(self, sendbuf, recvbuf, op=MPI.SUM) -> None:
        recv = plain(recvbuf)
        send = MPI.IN_PLACE if in_place(sendbuf) else plain(sendbuf)
        if recv is not None and send is not None and self._reproducible is False:
            api.allreduce(send, recv, op=op, algorithm=self._per["allreduce"], comm=self.comm)
            return
        self._run("Allreduce", api.allreduce, self._reduce_args, (sendbuf, recvbuf),
                  "allreduce", op=op)

    def Iallreduce(self, sendbuf, recvbuf, op=MPI.SUM) -> Request:
        return self._start("Iallreduce", api.iallreduce, self._reduce_args, (sendbuf, recvbuf),
                           "allreduce", op=op)

    def Allreduce_init(self, sendbuf, recvbuf, op=MPI.SUM, info=None) -> Prequest:
        return self._init("Allreduce_init", persistent.allreduce_init, self._reduce_args,
                          (sendbuf, recvbuf), "allreduce", op=op)

    def Reduce_scatter_block(self, sendbuf, recvbuf, op=MPI.SUM) -> None:
        self._run("Reduce_scatter_block", api.reduce_scatter_block, self._scatter_args,
                  (sendbuf, recvbuf), "reduce_scatter_block", op=op)

    def Ireduce_scatter_block(self, sendbuf, recvbuf, op=MPI.SUM) -> Request:
        return self._start("Ireduce_scatter_block", api.ireduce_scatter_block,
                           self._scatter_args, (sendbuf, recvbuf), "reduce_scatter_block", op=op)

    def Reduce_scatter_block_init(self, sendbuf, recvbuf, op=MPI.SUM, info=None) -> Prequest:
        return self._init("Reduce_scatter_block_init", persistent.reduce_scatter_block_init,
                          self._scatter_args, (sendbuf, recvbuf), "reduce_scatter_block", op=op)

    def Allgather(self, sendbuf, recvbuf) -> None:
        self._run("Allgather", api.allgather, self._gather_args, (sendbuf, recvbuf),
                  "allgather")

    def Iallgather(self, sendbuf, recvbuf) -> Request:
        return self._start("Iallgather", api.iallgather, self._gather_args, (sendbuf, recvbuf),
                           "allgather")

    def Allgather_init(self, sendbuf, recvbuf, info=None) -> Prequest:
        return self._init("Allgather_init", persistent.allgather_init, self._gather_args,
                          (sendbuf, recvbuf), "allgather")

    def Bcast(self, buf, root: int = 0) -> None:
        self._run("Bcast", api.bcast, self._bcast_args, (buf, root), "bcast")

    def Ibcast(self, buf, root: int = 0) -> Request:
        return self._start("Ibcast", api.ibcast, self._bcast_args, (buf, root), "bcast")

    def Bcast_init(self, buf, root: int = 0, info=None) -> Prequest:
        return self._init("Bcast_init", persistent.bcast_init, self._bcast_args, (buf, root),
                          "bcast")


    # ULFM's calls, implemented by mpicoll (mpicoll.recovery; docs/reliability.md)

    def Revoke(self) -> None:
        """Every rank's current and later mpicoll calls on this communicator fail."""
        recovery.revoke(self.comm)

    def Is_revoked(self) -> bool:
        return recovery.is_revoked(self.comm)

    def Shrink(self) -> "Comm":
        """A ``Comm`` (same algorithm choice) of the living ranks, in rank order."""
        return Comm(recovery.shrink(self.comm), self.algorithm, fallback=self.fallback,
                    reproducible=self.reproducible)

    def Agree(self, flag: int) -> int:
        """The bitwise AND of ``flag`` over the living ranks, the same on each of them."""
        return recovery.agree(self.comm, flag)

    def Get_failed(self) -> MPI.Group:
        """The group of this communicator's ranks known dead here."""
        return recovery.get_failed(self.comm)

    def Ack_failed(self, num_to_ack: int | None = None) -> int:
        """Acknowledge the failures known here (``num_to_ack`` of them); how many are."""
        return recovery.ack_failed(self.comm, num_to_ack)


def wrap(comm=None, algorithm="auto", *, fallback: bool = False, reproducible=False) -> Comm:
    """``Comm(comm, algorithm, fallback=fallback, reproducible=reproducible)``."""
    return Comm(comm, algorithm, fallback=fallback, reproducible=reproducible)


def _op_name(op):
    """The op's name, or None for one mpicoll does not reduce with (the call then says so)."""
    try:
        return ops.name(op)
    except TypeError:
        return None
