"""The socket executor: runs a schedule over plain TCP sockets between processes, no MPI.

The seeds' Lab 01 builds the ring all-reduce "over sockets"; this is that, for any
``mpicoll.schedule.Schedule``: the same schedules the MPI executor runs, here over a full mesh
of TCP connections on 127.0.0.1 (``SocketComm``). A message is an 8-byte length followed by
the elements; messages between two ranks match in order, as the schedules assume. Each step
posts all its transfers at once and drives them with a selector until every one is done --
non-blocking, so two ranks sending each other a large vector cannot deadlock on full socket
buffers -- then reduces the received data into the buffer with ``mpicoll.kernels``, in the
step's order (the MPI executor's rules). Bytes are counted in ``comm.traffic``.

Failures, the point of the lab: a peer that closes its connection (a killed process) raises
``PeerLost`` naming it at once. A peer that is alive but silent (frozen, hung, a lost network
path) makes a step wait forever -- unless ``timeout`` is given: then a step with no progress
for ``timeout`` seconds raises ``PeerTimeout`` naming the peers it still waits for.

    listeners, ports = open_listeners(size)      # in the parent, before starting the ranks
    comm = SocketComm.connect(rank, size, listeners[rank], ports)    # in rank ``rank``
    execute(schedule, buf, comm, op="sum", timeout=5.0)
"""

from __future__ import annotations

import selectors
import socket
import struct
import time

import numpy as np

from .. import kernels
from ..schedule import Schedule
from .step import reduce_received

__all__ = ["PeerFault", "PeerLost", "PeerTimeout", "SocketComm", "open_listeners", "execute"]

_HEADER = struct.Struct("!Q")        # message length in bytes
_HELLO = struct.Struct("!I")         # a connecting rank says who it is


class PeerFault(RuntimeError):
    """A peer failed during a step; ``peers`` are the ranks concerned."""

    def __init__(self, message: str, rank: int, step: int, peers: list[int]):
        super().__init__(message)
        self.rank, self.step, self.peers = rank, step, peers


class PeerLost(PeerFault):
    """A peer closed its connection (its process died)."""


class PeerTimeout(PeerFault):
    """A step made no progress with some peers for ``timeout`` seconds."""


def open_listeners(size: int) -> tuple[list[socket.socket], list[int]]:
    """One listening socket per rank on 127.0.0.1 (free ports), and their port numbers."""
    listeners = []
    for _ in range(size):
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.bind(("127.0.0.1", 0))
        s.listen(size)
        listeners.append(s)
    return listeners, [s.getsockname()[1] for s in listeners]


def _exactly(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise ConnectionError("connection closed during set-up")
        data += chunk
    return data


class SocketComm:
    """One rank's TCP connections to every other rank, and its byte counters."""

    def __init__(self, rank: int, size: int, peers: dict[int, socket.socket]):
        self.rank, self.size, self.peers = rank, size, peers
        self.traffic = {"bytes_sent": 0, "bytes_received": 0, "messages_sent": 0,
                        "header_bytes": 0}

    @classmethod
    def connect(cls, rank: int, size: int, listener: socket.socket, ports: list[int],
                timeout: float = 30.0) -> "SocketComm":
        """Connect to the lower ranks, accept the higher ones (each says its rank first)."""
        peers = {}
        for peer in range(rank):
            s = socket.create_connection(("127.0.0.1", ports[peer]), timeout=timeout)
            s.sendall(_HELLO.pack(rank))
            peers[peer] = s
        listener.settimeout(timeout)
        for _ in range(rank + 1, size):
            s, _ = listener.accept()
            s.settimeout(timeout)
            peers[_HELLO.unpack(_exactly(s, _HELLO.size))[0]] = s
        listener.close()
        for s in peers.values():
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            s.setblocking(False)
        return cls(rank, size, peers)

    def close(self) -> None:
        for s in self.peers.values():
            s.close()


class _Transfer:
    """One message of a step: header then payload, sent from or received into ``view``."""

    def __init__(self, peer: int, view: memoryview, send: bool):
        self.peer, self.view, self.send = peer, view, send
        self.header = bytearray(_HEADER.pack(len(view)) if send else _HEADER.size)
        self.done = 0                       # bytes of header + payload done

    @property
    def total(self) -> int:
        return _HEADER.size + len(self.view)

    def pending(self) -> memoryview:
        if self.done < _HEADER.size:
            return memoryview(self.header)[self.done:]
        return self.view[self.done - _HEADER.size:]


def execute(schedule: Schedule, buf: np.ndarray, comm: SocketComm, *, op: str = "sum",
            timeout: float | None = None, scratch: np.ndarray | None = None) -> None:
    """Run ``schedule`` on the flat array ``buf`` over ``comm`` (see the module's doc).

    ``scratch`` (``schedule.scratch_elements`` of ``buf``'s dtype) is allocated if not given.
    """
    reduce_into = kernels.kernel(op, buf.dtype)
    if scratch is None:
        scratch = np.empty(schedule.scratch_elements, buf.dtype)
    buf, scratch = kernels.as_storage(buf), kernels.as_storage(scratch)   # half types: uint16
    raw = lambda a: memoryview(a).cast("B")          # noqa: E731 - bytes of an array slice
    nsteps = len(schedule.plan)
    for index, (recvs, sends) in enumerate(schedule.plan):
        queues: dict[int, list[list[_Transfer]]] = {}        # peer -> [sends, receives]
        for peer, lo, hi in sends:
            queues.setdefault(peer, [[], []])[0].append(_Transfer(peer, raw(buf[lo:hi]), True))
        for peer, lo, hi, reduce, _, at, _ in recvs:
            into = scratch[at:at + hi - lo] if reduce else buf[lo:hi]
            queues.setdefault(peer, [[], []])[1].append(_Transfer(peer, raw(into), False))
        _progress(comm, queues, index, nsteps, timeout)
        for peer, lo, hi, *_ in recvs:
            comm.traffic["bytes_received"] += (hi - lo) * buf.itemsize
        reduce_received(buf, scratch, recvs, reduce_into)
        for peer, lo, hi in sends:
            comm.traffic["bytes_sent"] += (hi - lo) * buf.itemsize
            comm.traffic["header_bytes"] += _HEADER.size
        comm.traffic["messages_sent"] += len(sends)


def _progress(comm: SocketComm, queues: dict, index: int, nsteps: int,
              timeout: float | None) -> None:
    """Drive every transfer of one step to completion (or raise naming the peers)."""
    where = f"rank {comm.rank}, step {index} of {nsteps}"
    with selectors.DefaultSelector() as sel:
        def want(peer: int) -> int:
            out, inc = queues[peer]
            return (selectors.EVENT_WRITE if out else 0) | (selectors.EVENT_READ if inc else 0)

        for peer in queues:
            sel.register(comm.peers[peer], want(peer), peer)
        last = time.monotonic()
        while any(out or inc for out, inc in queues.values()):
            wait = None if timeout is None else max(0.0, last + timeout - time.monotonic())
            events = sel.select(wait)
            if not events and timeout is not None and time.monotonic() - last >= timeout:
                waiting = sorted(p for p, (out, inc) in queues.items() if out or inc)
                raise PeerTimeout(f"{where}: no progress for {timeout:g} s; still waiting for "
                                  f"rank(s) {waiting} (dead, frozen or unreachable?)",
                                  comm.rank, index, waiting)
            for key, mask in events:
                peer = key.data
                out, inc = queues[peer]
                try:
                    if mask & selectors.EVENT_WRITE and out:
                        out[0].done += key.fileobj.send(out[0].pending())
                        if out[0].done == out[0].total:
                            out.pop(0)
                    if mask & selectors.EVENT_READ and inc:
                        t = inc[0]
                        n = key.fileobj.recv_into(t.pending())
                        if n == 0:
                            raise ConnectionResetError("connection closed")
                        t.done += n
                        if t.done == _HEADER.size:
                            length = _HEADER.unpack(t.header)[0]
                            if length != len(t.view):
                                raise PeerFault(f"{where}: rank {peer} sent {length} bytes, "
                                                f"the schedule expects {len(t.view)}",
                                                comm.rank, index, [peer])
                        if t.done == t.total:
                            inc.pop(0)
                except (ConnectionError, BrokenPipeError) as e:
                    raise PeerLost(f"{where}: lost rank {peer} ({e}); it died or closed its "
                                   "connection", comm.rank, index, [peer]) from None
                last = time.monotonic()
                if out or inc:
                    sel.modify(key.fileobj, want(peer), peer)
                else:
                    sel.unregister(key.fileobj)
