"""The public collectives: argument checks, buffer set-up, algorithm choice, execution.

Semantics follow MPI's: ``comm`` defaults to ``MPI.COMM_WORLD``; ``sendbuf=MPI.IN_PLACE`` means
``recvbuf`` holds the input and receives the result; ``recvbuf=None`` allocates and returns it;
out-of-place calls never modify ``sendbuf``; any C-contiguous numpy array is reduced element-wise
over its flat view. Bad input raises on the calling rank before any communication.

Every collective also takes three keyword-only reliability options (``mpicoll._runtime.call``;
docs/reliability.md): ``timeout`` (seconds; default ``MPICOLL_TIMEOUT``, else 600; ``math.inf``:
none) bounds every wait and raises ``CollectiveTimeout`` naming the missing ranks (or
``ArgumentMismatch`` when the ranks' arguments, hashed into the message tags, differ);
``on_timeout="abort"`` (default ``MPICOLL_ON_TIMEOUT``) calls ``MPI_Abort`` instead;
``validate=True`` (default ``MPICOLL_VALIDATE``) first checks that every rank passed the same
count, dtype, op, algorithm and root, raising ``ArgumentMismatch`` on every rank if not.
"""

from __future__ import annotations

import functools
import time

import numpy as np
from mpi4py import MPI
from mpi4py.util import dtlib

from . import compression, kernels, model, select, settings, shm
from ._runtime import context
from ._runtime.call import Call, disagree, failed
from ._runtime.watch import Watch
from .errors import ArgumentMismatch, CollectiveTimeout
from .executors import compiled
from .executors.progress import Request, waitall
from .registry import ALLREDUCE, COLLECTIVES, Algorithm, lookup

__all__ = ["allreduce", "reduce_scatter_block", "allgather", "bcast", "ALGORITHMS",
           "iallreduce", "ireduce_scatter_block", "iallgather", "ibcast", "waitall", "Request"]

ALGORITHMS = tuple(ALLREDUCE)
_OPS = {"sum": MPI.SUM, "prod": MPI.PROD, "max": MPI.MAX, "min": MPI.MIN,
        "land": MPI.LAND, "lor": MPI.LOR, "lxor": MPI.LXOR,
        "band": MPI.BAND, "bor": MPI.BOR, "bxor": MPI.BXOR}
_DTYPE_NAMES = ", ".join(str(d) for d in kernels.DTYPES)


# ----------------------------------------------------------------------------- argument checks

def _mpi_name(op) -> str:
    """``MPI.BAND`` for mpi4py's predefined op object, else its repr."""
    for name in dir(MPI):
        value = getattr(MPI, name)
        if isinstance(value, MPI.Op) and value == op and value != MPI.OP_NULL:
            return f"MPI.{name}"
    return repr(op)


def _op_name(op) -> str:
    if isinstance(op, str) and op.lower() in _OPS:
        return op.lower()
    if isinstance(op, MPI.Op):
        for name, mpi_op in _OPS.items():
            if op == mpi_op:
                return name
    shown = _mpi_name(op) if isinstance(op, MPI.Op) else repr(op)
    if (op == MPI.MAXLOC or op == MPI.MINLOC) if isinstance(op, MPI.Op) else \
            (isinstance(op, str) and op.lower() in ("maxloc", "minloc")):
        best = "MAX" if "max" in shown.lower() else "MIN"
        raise TypeError(
            f"op {shown} is not supported: it reduces (value, index) pairs (MPI's pair types, "
            f"MPI.DOUBLE_INT and the like), and mpicoll reduces arrays of one numeric dtype "
            f"element-wise. Instead: m = allreduce(x, op=MPI.{best}), then allreduce("
            f"np.where(x == m, index, big), op=MPI.MIN) gives the lowest index holding it "
            f"(MPI's rule for ties); or mpi4py's comm.allreduce((value, index), op=MPI.{best}LOC)")
    raise TypeError(f"unsupported op {shown}; expected one of MPI."
                    f"{', MPI.'.join(name.upper() for name in _OPS)} or of {list(_OPS)}")


@functools.lru_cache(maxsize=None)
def _library_has(dtype: np.dtype) -> bool:
    """Whether the MPI library has a datatype for ``dtype`` (mpi4py's mapping; none for
    bfloat16, nor for float16 in a library without MPIX_C_FLOAT16)."""
    try:
        return dtlib.from_numpy_dtype(dtype) != MPI.DATATYPE_NULL
    except (ValueError, KeyError, TypeError):
        return False


def _check_op(collective: str, op: str | None, dtype: np.dtype, algo: Algorithm | None) -> None:
    """``op`` applies to ``dtype`` (MPI's rules, ``kernels.check``) and, when the MPI library
    runs the reduction (``algorithm="mpi"``), the library has the type: else a TypeError on
    this rank, before any communication."""
    if op is None:
        return
    kernels.check(op, dtype)
    if algo is not None and algo.library and not _library_has(dtype):
        own = ", ".join(repr(name) for name, a in COLLECTIVES[collective].items()
                        if not a.library)
        raise TypeError(f"algorithm={algo.name!r}: the MPI library has no datatype for {dtype}, "
                        f"so it can't reduce it; use 'auto' or one of mpicoll's own algorithms "
                        f"({own})")


def _unless_library_lacks(collective: str, algo: Algorithm, dtype: np.dtype, op: str,
                          nbytes: int, size: int, count: int) -> Algorithm:
    """``auto``'s choice ``algo``, unless it is the MPI library's and the library can't reduce
    ``dtype``: then MPICH's classic rule, which names only mpicoll's own algorithms."""
    if algo.library and not _library_has(dtype):
        return lookup(collective, select.without_library(collective, nbytes, size, count))
    return algo


def _kind(x) -> str:
    t = type(x)
    return t.__name__ if t.__module__ == "builtins" else f"{t.__module__}.{t.__qualname__}"


_DLPACK_CPU = 1         # DLPack's kDLCPU


def _view(x, name: str) -> np.ndarray:
    """A numpy array over ``x``'s own memory, never a copy: ``x`` has ``__array_interface__``
    (or ``__array_struct__``), ``__dlpack__`` (a CPU tensor: PyTorch, JAX ...) or the buffer
    protocol (``array.array``, ``memoryview``: their format gives the dtype; ``bytearray`` and
    ``bytes`` are uint8, ``bytes`` read-only)."""
    if isinstance(x, (list, tuple)):
        raise TypeError(f"{name} must be an array, got {type(x).__name__}; pass "
                        f"np.asarray({name}) (a copy: a result would not land in the "
                        f"{type(x).__name__})")
    if isinstance(x, np.generic):               # a scalar: immutable, so read-only here
        view = np.array(x)
        view.flags.writeable = False
        return view
    if hasattr(x, "__array_interface__") or hasattr(x, "__array_struct__"):
        return np.asarray(x)                    # numpy maps the interface: no copy
    if hasattr(x, "__dlpack__"):
        device = x.__dlpack_device__() if hasattr(x, "__dlpack_device__") else None
        if device is not None and device[0] != _DLPACK_CPU:
            raise TypeError(f"{name} ({_kind(x)}) lives on DLPack device {tuple(device)}, not "
                            f"the CPU: mpicoll reduces host memory; pass a CPU tensor")
        try:
            return np.from_dlpack(x, copy=False)
        except (BufferError, TypeError, ValueError, RuntimeError) as exc:
            raise TypeError(f"{name} ({_kind(x)}) cannot be read through DLPack without a "
                            f"copy: {exc}") from None
    try:
        memory = memoryview(x)
    except TypeError:
        raise TypeError(f"{name} must be an array (numpy, or an object with the buffer "
                        f"protocol, __array_interface__ or __dlpack__), got {_kind(x)}") from None
    try:
        return np.asarray(memory)
    except (TypeError, ValueError, NotImplementedError) as exc:
        raise TypeError(f"{name} ({_kind(x)}) has buffer format {memory.format!r}, which numpy "
                        f"cannot read: {exc}") from None


def _array(x, name: str, *, writable: bool = False) -> np.ndarray:
    if not isinstance(x, np.ndarray):           # numpy first: its path is unchanged
        x = _view(x, name)
    if isinstance(x, np.ma.MaskedArray):
        raise TypeError(f"{name} is a masked array: mpicoll would reduce its masked values too; "
                        f"pass {name}.filled(value) (masked elements replaced) or "
                        f"np.asarray({name}) (all of them)")
    if x.dtype not in kernels.DTYPES:
        raise TypeError(f"{name} has unsupported dtype {x.dtype}; supported: {_DTYPE_NAMES}")
    if not x.flags.c_contiguous:
        raise ValueError(f"{name} must be C-contiguous (got strides {x.strides} for shape "
                         f"{x.shape}); pass np.ascontiguousarray({name})")
    if writable and not x.flags.writeable:
        raise ValueError(f"{name} is read-only")
    return x


def _algorithm(collective: str, algorithm) -> Algorithm | None:
    """The declared algorithm (an alias is resolved), or None for ``auto``."""
    return None if algorithm == "auto" else lookup(collective, algorithm)


def _buffers(sendbuf, recvbuf, recv_count, recv_shape):
    """Check and pair the buffers: returns (input array or None for IN_PLACE, output array).

    ``recv_count(n)`` is the element count recvbuf must have for a sendbuf of n elements, and
    ``recv_shape(sendbuf)`` the shape of a recvbuf to allocate.
    """
    if sendbuf is MPI.IN_PLACE:
        if recvbuf is None:
            raise ValueError("sendbuf=MPI.IN_PLACE needs a recvbuf holding the input")
        return None, _array(recvbuf, "recvbuf", writable=True)
    send = _array(sendbuf, "sendbuf")
    want = recv_count(send.size)
    if recvbuf is None:
        return send, np.empty(recv_shape(send), send.dtype)
    recv = _array(recvbuf, "recvbuf", writable=True)
    if recv.dtype != send.dtype:
        raise ValueError(f"recvbuf dtype {recv.dtype} does not match sendbuf dtype {send.dtype}")
    if recv.size != want:
        raise ValueError(f"recvbuf has {recv.size} elements, expected {want} "
                         f"(sendbuf has {send.size})")
    if np.may_share_memory(send, recv):
        raise ValueError("sendbuf and recvbuf overlap; for an in-place call pass "
                         "sendbuf=MPI.IN_PLACE")
    return send, recv


def _reduce_scatter_buffers(sendbuf, recvbuf, size: int):
    """reduce_scatter_block's buffers: ``(send or None, recv, total elements, block size)``."""
    def block_shape(s):
        return s.shape[1:] if s.ndim > 1 and s.shape[0] == size else (s.size // size,)

    send, recv = _buffers(sendbuf, recvbuf, lambda n: n // size, block_shape)
    total = recv.size if send is None else send.size
    if total % size:
        raise ValueError(f"{'recvbuf' if send is None else 'sendbuf'} has {total} elements, "
                         f"not a multiple of the communicator size {size}")
    return send, recv, total, total // size


def _allgather_buffers(sendbuf, recvbuf, size: int):
    """allgather's buffers: ``(send or None, recv, block size)``."""
    send, recv = _buffers(sendbuf, recvbuf, lambda n: n * size, lambda s: (size,) + s.shape)
    if recv.size % size:
        raise ValueError(f"recvbuf has {recv.size} elements, not a multiple of the "
                         f"communicator size {size}")
    return send, recv, recv.size // size


def _root(root, size: int) -> int:
    if not isinstance(root, (int, np.integer)) or isinstance(root, (bool, np.bool_)):
        raise TypeError(f"root must be an integer rank, got {type(root).__name__} {root!r}")
    if not 0 <= root < size:
        raise ValueError(f"root {root!r} out of range for a communicator of size {size}")
    return int(root)


# ----------------------------------------------------------------------------- execution
#
# The order of every collective: this rank's own checks and the settings it needs (no
# communication); ``call.open()`` (collective on a communicator's first use); what needs the
# node layout (``auto``'s choice, the options of node-aware algorithms) and everything else that
# can still fail on this rank -- the schedule, the kernel, the scratch, copies; then the agreement
# step (``call.agree``); then only communication and copies that cannot fail. So a rank never
# raises after the others have passed the agreement step and wait for its messages.

_AUTO_SETTINGS = ("MPICOLL_TUNING", "MPICOLL_PROFILE", "MPICOLL_SHORT_MSG")


def _local_checks(algo: Algorithm | None, op: str | None, given: dict) -> None:
    """Read (parse and check) the settings this call will need, and check the algorithm's
    options given or set in the environment, all before any communication: a bad value raises
    here, naming it, on every rank that has it. (A default that depends on the node layout, and
    whether the options fit that layout, are checked once it is known.)"""
    if algo is None or algo.has("node-layout"):
        settings.get("MPICOLL_RANKS_PER_NODE")  # the node layout
    if algo is None:
        for name in _AUTO_SETTINGS:
            settings.get(name)
    if op is not None and (algo is None or not algo.library):
        settings.get("MPICOLL_KERNELS")
    for option in algo.options if algo is not None else ():
        value = given.get(option.name)
        if value is None and option.env:
            value = settings.get(option.env)
        if value is not None:
            option.value(value)


@functools.lru_cache(maxsize=256)
def _plan(algo: Algorithm, rank: int, size: int, count: int, options: tuple, nodes: tuple):
    """The schedule, and how many elements it sends to ranks on other nodes (for the traffic
    counters: counted once per schedule, not per message)."""
    kwargs = dict(options, **({"nodes": nodes} if algo.has("node-layout") else {}))
    sched = algo.schedule(rank, size, count, **kwargs)
    node_of = {r: j for j, members in enumerate(nodes) for r in members}
    internode = sum(hi - lo for _, sends in sched.plan for peer, lo, hi in sends
                    if node_of[peer] != node_of[rank])
    return sched, internode


def _scheduled(call: Call, algo: Algorithm, count: int, options: dict) -> tuple:
    """``(schedule, inter-node elements, options, nodes)`` for this rank: the options completed
    with what the cost model picks (``Algorithm.pick``), the schedule cached."""
    st, comm = call.open(), call.comm
    size, nodes = comm.Get_size(), st.nodes()
    if algo.pick is not None:
        options = {**options, **_picked(algo, size, count, nodes)}
    sched, internode = _plan(algo, comm.Get_rank(), size, count, tuple(options.items()), nodes)
    return sched, internode, options, nodes


def _prepare(call: Call, algo: Algorithm, count: int, dtype, op: str | None, options: dict):
    """What running ``algo``'s schedule needs -- the executor, the schedule, its inter-node
    elements, the op, the scratch -- made before the agreement step (None: nothing to run)."""
    comm = call.comm
    if algo.has("shared-memory"):       # no schedule: checked and compiled here, run by the call
        shm.check(call.open(), op, np.dtype(dtype))
        shm.warmup(np.dtype(dtype))
        return SharedMemory(call, np.dtype(dtype), op) \
            if comm.Get_size() > 1 and count > 0 else None
    if options.get("inner") == "shm":   # node phases in shared memory (hierarchical's option)
        shm.check_node_phases(call.open(), op, np.dtype(dtype))
        shm.warmup(np.dtype(dtype))
        return SharedMemory(call, np.dtype(dtype), op, algo, options["outer"]) \
            if comm.Get_size() > 1 and count > 0 else None
    if algo.library or comm.Get_size() == 1 or count == 0:
        return None
    execute = _execute or _choose_executor()        # MPICOLL_EXECUTOR
    sched, internode, _, _ = _scheduled(call, algo, count, options)
    op = op or kernels.ops_for(dtype)[0]            # nothing is reduced (allgather, bcast)
    if execute is not compiled.execute:             # (the compiled loop compiles its own)
        _warmup(call, op, dtype)
    scratch = call.open().scratch(dtype, compiled.scratch_elements(execute, sched, dtype.itemsize))
    return execute, sched, internode, op, scratch


class SharedMemory:
    """A blocking or persistent all-reduce in ``mpicoll.shm``'s window, on this rank: ``shm``
    itself (every rank on one node), or -- with ``algo`` and ``outer`` -- an algorithm's node
    phases with ``inner="shm"`` (hierarchical): the window of this rank's node, and between the
    node phases the ``outer`` all-reduce of its shard of each chunk with the same local rank of
    every other node (the executor ``MPICOLL_EXECUTOR`` chooses, on the call's tag and
    deadline)."""

    def __init__(self, call: Call, dtype: np.dtype, op: str, algo: Algorithm | None = None,
                 outer: str | None = None):
        self.st = st = call.open()
        self.op, self.nodes = op, None
        if outer is None:
            return
        self.nodes = st.nodes()
        rank = st.comm.Get_rank()
        self.node = next(j for j, members in enumerate(self.nodes) if rank in members)
        local = self.nodes[self.node].index(rank)
        self.peers = [members[local] for members in self.nodes]
        self.outer = algo.module.OUTER[outer]
        self.execute = _execute or _choose_executor()
        if self.execute is not compiled.execute and len(self.nodes) > 1:
            _warmup(call, op, dtype)
        self._schedules: dict = {}

    def run(self, src: np.ndarray, dst: np.ndarray, tag: int, watch, signature: int,
            mismatch) -> None:
        """From ``src`` (flat; may be ``dst``: in place) into ``dst``. ``watch``: the call's
        ``Watch`` (or None), or a function that makes it (a prepared call's,
        ``Prepared.shared``); ``signature``, ``mismatch``: ``shm.allreduce``'s."""
        if self.nodes is None:
            shm.allreduce(self.st, src, dst, self.op, watch, signature, mismatch, tag=tag)
            return
        st = self.st

        def between(part: np.ndarray) -> None:      # all-reduce my shard across the nodes
            sched = self._schedules.get(part.size)
            if sched is None:
                sched = self._schedules[part.size] = self.outer.schedule(
                    self.node, len(self.nodes), part.size).remap(self.peers)
            scratch = st.scratch(part.dtype, compiled.scratch_elements(self.execute, sched,
                                                                       part.itemsize))
            self.execute(sched, part, st.comm, op=self.op, tag=tag, scratch=scratch,
                         traffic=st.traffic, watch=watch() if callable(watch) else watch)
            st.traffic["internode_bytes"] += sched.totals[0] * part.itemsize  # all off-node
        shm.allreduce(st, src, dst, self.op, watch, signature, mismatch, tag=tag,
                      nodes=self.nodes, between=between if len(self.nodes) > 1 else None)


def _warmup(call: Call, op: str, dtype) -> None:
    """Compile (or load) ``op``'s kernel for ``dtype`` (``kernels.warmup``), before the
    agreement step; the time is local work, not charged to the call's deadline."""
    spent = kernels.warmup(op, dtype)
    if call.watch is not None:
        call.watch.deadline += spent


_execute = None         # the executor (MPICOLL_EXECUTOR), chosen at the first call


def _choose_executor():
    global _execute
    _execute = compiled.choose()
    return _execute


@settings.on_reload
def _forget_executor() -> None:
    global _execute
    _execute = None


def _run(call: Call, prepared, flat: np.ndarray) -> None:
    execute, sched, internode, op, scratch = prepared
    st = call.open()
    execute(sched, flat, st.comm, op=op, tag=call.tag, scratch=scratch, traffic=st.traffic,
            watch=call.watch)
    st.traffic["internode_bytes"] += internode * flat.itemsize     # counted once per schedule


def _options(call: Call, algo: Algorithm, given: dict, auto: bool = False) -> dict:
    """The algorithm's declared options, resolved and checked on this rank (before the
    agreement step); ``auto``: in the order ``select`` gives rings across nodes. The node
    layout itself is added by ``_scheduled``."""
    if not algo.options and not algo.has("node-layout") and not any(given.values()):
        return {}                           # the common case, kept cheap
    nodes = call.open().nodes() if algo.has("node-layout") else None
    if auto and "order" in {o.name for o in algo.options}:
        given = {**given, "order": select.ring_order(nodes)}
    return dict(_resolved(algo, tuple(given.items()), nodes))


@functools.lru_cache(maxsize=256)
def _picked(algo: Algorithm, size: int, count: int, nodes) -> dict:
    """What the cost model chooses for ``algo`` (``Algorithm.pick``), from the profile ``auto``
    uses, on the link between nodes when there are several."""
    profile = model.default_profile()
    alpha, beta = profile.link(len(nodes) > 1)
    return algo.pick(size, count, nodes, alpha, beta, profile.gamma)


@functools.lru_cache(maxsize=256)
def _resolved(algo: Algorithm, given: tuple, nodes) -> tuple:
    """``algo.resolve``, cached: the environment is read once (``settings.reload`` clears it)."""
    return tuple(algo.resolve(dict(given), nodes).items())


settings.on_reload(_resolved.cache_clear)
settings.on_reload(_picked.cache_clear)


def _shared_memory(call: Call, op: str, dtype) -> bool:
    """Whether ``auto`` may run ``shm`` (``select``): ``shm.usable``."""
    return shm.usable(call.open(), op, dtype)


def _shm_signature(call: Call) -> tuple:
    """``shm``'s (signature, mismatch): the hash of the call's arguments, which every rank
    publishes beside its input in the shared window, and what to do when they differ."""
    return (call.signature.hashed, lambda: call.disagree(
        "the argument check of the shared-memory all-reduce (the ranks' hashes differ)"))


def _nodes(call: Call, algo: Algorithm):
    """The node layout a node-aware algorithm runs on (for the agreement step), else None."""
    return call.open().nodes() if algo.has("node-layout") else None


# ----------------------------------------------------------------------------- prepared calls
#
# A plain call that comes again with the same arguments -- the same communicator, algorithm,
# op, dtype, count, in place or not, options, reliability options -- would make the same
# decisions again: the checks of the op and dtype, the settings, ``auto``'s choice, the options,
# the schedule, the executor's arguments, the signature hashed into the tag. The first such call
# (the full path above) keeps them as a ``Prepared`` in the communicator's state (``CommState``:
# a communicator freed, and its handle reused, starts empty), in a least-recently-used table of
# ``PREPARED_PER_COMM`` entries; its key holds ``_epoch``, which ``settings.reload()`` bumps. A
# later call with the same key then does only what depends on the buffers themselves -- exact
# numpy arrays, C-contiguous, recvbuf writable, no overlap -- and, when any check fails, takes
# the full path, which raises the same error as ever. Then the broken-communicator check, the
# call number and tag, the copy and the run; under a deadline, the deadline is a time of
# ``MPI_Wtime`` and a ``Watch`` is made only if a round outlasts the compiled loop's spin
# (``compiled.Reusable``). Kept only for the compiled executor's schedules and for ``shm`` (whose
# deadline's ``Watch`` is likewise made only if a wait outlasts a spin), and never with
# ``validate`` (which agrees every call): other calls take the full path every time.

PREPARED_PER_COMM = 64
_epoch = 0


@settings.on_reload
def _new_epoch() -> None:
    global _epoch
    _epoch += 1


_OP_KEYS = {id(mpi_op): name for name, mpi_op in _OPS.items()}     # MPI.SUM ... live forever


class Prepared:
    """A plain call's decisions, for a call with the same key (see above)."""

    __slots__ = ("collective", "numbered", "offset", "what", "signature", "timeout",
                 "on_timeout", "run", "internode_bytes", "rank", "block", "shared_memory",
                 "hashed", "agreed")

    def __init__(self, call: Call, prepared, dtype: np.dtype, block: int = 0):
        self.collective, self.rank, self.block = call.collective, call.comm.Get_rank(), block
        self.numbered = call._state is not None         # the call took a number (and a tag)
        sig = call.signature
        self.offset = 0 if sig is None else sig.offset
        self.signature = "" if sig is None else sig.text
        self.what = call.watch.what if call.watch is not None else call.collective
        self.timeout, self.on_timeout = call.timeout, call.on_timeout
        self.run, self.internode_bytes = None, 0
        # shm and the node phases in shared memory run by ``shared``, not ``__call__``
        self.shared_memory = prepared if isinstance(prepared, SharedMemory) else None
        if self.shared_memory is not None:
            self.hashed, self.agreed = sig.hashed, call._agreed_on
        elif prepared is not None:
            _, sched, internode, op, scratch = prepared
            st = call.open()
            self.run = compiled.Reusable(sched, dtype, st.comm, op=op, scratch=scratch,
                                         traffic=st.traffic)
            self.internode_bytes = internode * dtype.itemsize

    def __call__(self, st, buf: np.ndarray) -> None:
        """Run on ``buf`` (the input copied in already) as a new call on ``st``."""
        if st.broken:
            st.check(self.collective)
        number = st.next_number() if self.numbered else 0
        run = self.run
        if run is None:
            return
        flat = buf.reshape(-1)
        watch = None
        try:
            if self.timeout is None:
                run.run(flat, number + self.offset)
            else:
                def make_watch(left: float) -> Watch:
                    nonlocal watch
                    watch = self._watch(st, number, left)
                    return watch
                run.run(flat, number + self.offset, self.timeout, make_watch)
        except (CollectiveTimeout, ArgumentMismatch, KeyboardInterrupt) as exc:
            if not isinstance(exc, ArgumentMismatch) or exc.in_flight:
                failed(st, watch, self.on_timeout, st.parent, exc)
            raise
        if self.internode_bytes:
            st.traffic["internode_bytes"] += self.internode_bytes

    def shared(self, st, src: np.ndarray, dst: np.ndarray) -> None:
        """Run ``shm`` (or hierarchical's shm node phases) from ``src`` (flat; may be ``dst``)
        into ``dst`` as a new call on ``st``."""
        if st.broken:
            st.check(self.collective)
        number = st.next_number() if self.numbered else 0
        start, watch = time.monotonic(), None

        def get_watch():                # made when first needed, with the call's deadline
            nonlocal watch
            if watch is None and self.timeout is not None:
                watch = self._watch(st, number, start + self.timeout - time.monotonic())
            return watch

        def mismatch():
            disagree(st.comm, self.collective, self.agreed, self.timeout is not None,
                     get_watch(), "the argument check of the shared-memory all-reduce (the "
                     "ranks' hashes differ)")
        try:
            self.shared_memory.run(src, dst, number + self.offset, get_watch, self.hashed,
                                   mismatch)
        except (CollectiveTimeout, ArgumentMismatch, KeyboardInterrupt) as exc:
            if not isinstance(exc, ArgumentMismatch) or exc.in_flight:
                failed(st, watch, self.on_timeout, st.parent, exc)
            raise

    def _watch(self, st, number: int, left: float) -> Watch:
        """The deadline of call ``number``, ``left`` seconds from now, as the full path's."""
        watch = Watch(self.timeout, self.what, st.comm)
        watch.deadline = time.monotonic() + left
        watch.tag, watch.number, watch.calls = number + self.offset, number, st.tags.calls
        watch.signature = self.signature
        return watch


def _remember(call: Call, key, prepared, dtype: np.dtype, block: int = 0) -> None:
    """Keep the decisions of ``call`` (done) for calls with ``key`` (None: not kept);
    ``block``: the elements of one rank's block (reduce_scatter_block, allgather)."""
    if key is None or call.validate or (prepared is not None
                                        and not isinstance(prepared, SharedMemory)
                                        and prepared[0] is not compiled.execute):
        return
    st = context.attach(call.comm)
    table = st.prepared
    entry = table[key] = Prepared(call, prepared, dtype, block)
    st.last_prepared = key, entry
    if len(table) > PREPARED_PER_COMM:
        table.popitem(last=False)


def _prepared(comm, key):
    """The prepared call of ``key`` on ``comm``, or None (the full path). The table is a
    least-recently-used one: a hit moves its entry last, unless it is the last one already."""
    if comm is None:
        comm = MPI.COMM_WORLD
    elif not isinstance(comm, MPI.Intracomm):
        return None, None
    try:
        st = context.known(comm)
    except MPI.Exception:           # a freed communicator: the full path names it
        return None, None
    if st is None:
        return None, None
    last = st.last_prepared                 # (key, entry), replaced whole: thread-safe
    if key == last[0]:
        return st, last[1]
    entry = st.prepared.get(key)
    if entry is not None:
        try:
            st.prepared.move_to_end(key)
        except KeyError:                    # another thread dropped it meanwhile
            pass
        st.last_prepared = key, entry
    return st, entry


def _key(collective: str, sendbuf, recvbuf, op, algorithm, options: tuple, timeout, on_timeout,
         validate):
    """The key of a call's decisions, or None (not one a prepared call serves): exact numpy
    arrays (sendbuf may be IN_PLACE; allreduce's recvbuf None), a predefined op (``""``: the
    collective has none), options and reliability options of the types that are valid (so
    that ``True == 1`` or ``np.int64(5) == 5`` cannot pass for another)."""
    if type(recvbuf) is np.ndarray:
        recv = recvbuf.dtype, recvbuf.size
    elif recvbuf is None and collective == "allreduce":
        recv = None, None
    else:
        return None
    if type(sendbuf) is np.ndarray:
        send = sendbuf.dtype, sendbuf.size
    elif sendbuf is MPI.IN_PLACE and recvbuf is not None:
        send = None, None
    else:
        return None
    opkey = op if type(op) is str else _OP_KEYS.get(id(op))
    if opkey is None:
        return None
    key = (collective, _epoch, algorithm, opkey, *send, *recv, *options)
    if timeout is None and on_timeout is None and validate is None:
        return key
    if (timeout is not None and type(timeout) is not float and type(timeout) is not int) or \
            (validate is not None and type(validate) is not bool):
        return None
    return key + (timeout, on_timeout, validate)


def _checked(sendbuf, recvbuf):
    """The checks of ``_buffers`` that depend on the buffers themselves, for a call whose key
    matched (dtypes and sizes are in the key): True when they pass, else False (the full path
    then raises the error)."""
    flags = recvbuf.flags
    if not (flags.c_contiguous and flags.writeable):
        return False
    if sendbuf is MPI.IN_PLACE:
        return True
    sflags = sendbuf.flags
    # two arrays that own their memory are two allocations: they can't overlap
    return sflags.c_contiguous and (flags.owndata and sflags.owndata and sendbuf is not recvbuf
                                    or not np.may_share_memory(sendbuf, recvbuf))


def _fast_allreduce(key, sendbuf, recvbuf, comm):
    """``allreduce`` by its prepared call, or None (the full path: no prepared call, or a
    check of the buffers fails, which the full path reports)."""
    st, entry = _prepared(comm, key)
    if entry is None:
        return None
    if recvbuf is None:
        if not sendbuf.flags.c_contiguous:
            return None
        recvbuf = np.empty(sendbuf.shape, sendbuf.dtype)
    elif not _checked(sendbuf, recvbuf):
        return None
    if entry.shared_memory is not None:     # it reads sendbuf itself
        entry.shared(st, (recvbuf if sendbuf is MPI.IN_PLACE else sendbuf).reshape(-1),
                     recvbuf.reshape(-1))
        return recvbuf
    if sendbuf is not MPI.IN_PLACE:
        if recvbuf.shape == sendbuf.shape:
            recvbuf[...] = sendbuf
        else:                       # same element count, any shape: the flat views
            np.copyto(recvbuf.reshape(-1), sendbuf.reshape(-1))
    entry(st, recvbuf)
    return recvbuf


# ----------------------------------------------------------------------------- collectives

def allreduce(sendbuf, recvbuf=None, *, op=MPI.SUM, algorithm="auto", comm=None,
              inner: str | None = None, outer: str | None = None, order: str | None = None,
              timeout=None, on_timeout=None, validate=None, compress=None, error_feedback=None):
    """All-reduce: every rank gets ``op`` over all ranks' ``sendbuf``, element-wise.

    ``algorithm`` is one of ``ALGORITHMS`` or ``"auto"``. ``inner``/``outer`` choose the
    node-local and inter-node algorithms of ``hierarchical`` (also ``MPICOLL_HIER_INNER`` /
    ``MPICOLL_HIER_OUTER``); ``order`` the order ``ring`` visits the ranks, ``"rank"``,
    ``"node"`` or ``"rail"`` (also ``MPICOLL_RING_ORDER``; ``mpicoll.topology.ring_order``).
    ``timeout``, ``on_timeout``, ``validate``: see the module's doc.
    ``compress`` / ``error_feedback``: see ``iallreduce`` (the call is ``iallreduce(...).wait()``).
    Returns ``recvbuf``.
    """
    if compress is not None or error_feedback is not None:
        return iallreduce(sendbuf, recvbuf, op=op, algorithm=algorithm, comm=comm, inner=inner,
                          outer=outer, order=order, timeout=timeout, on_timeout=on_timeout,
                          validate=validate, compress=compress,
                          error_feedback=error_feedback).wait()
    key = _key("allreduce", sendbuf, recvbuf, op, algorithm, (inner, outer, order), timeout,
               on_timeout, validate)
    if key is not None:
        done = _fast_allreduce(key, sendbuf, recvbuf, comm)
        if done is not None:
            return done
    with Call("allreduce", algorithm, comm, timeout, on_timeout, validate) as call:
        opname = _op_name(op)
        algo = _algorithm("allreduce", algorithm)
        comm = call.comm
        send, recv = _buffers(sendbuf, recvbuf, lambda n: n, lambda s: s.shape)
        _check_op(call.collective, opname, recv.dtype, algo)
        given = {"inner": inner, "outer": outer, "order": order}
        auto = algo is None
        if auto and (inner or outer or order):
            raise ValueError("inner/outer/order apply only to an algorithm that declares them, "
                             "not to 'auto'")
        _local_checks(algo, opname, given)
        size, count = comm.Get_size(), recv.size
        if auto:
            algo = _unless_library_lacks("allreduce", lookup("allreduce", select.allreduce(
                recv.nbytes, size, count, call.open().ranks_per_node if size > 1 else None,
                shared_memory=size > 1 and _shared_memory(call, opname, recv.dtype),
                single_copy=shm.single_copy_expected(size))),
                recv.dtype, opname, recv.nbytes, size, count)
        options = _options(call, algo, given, auto)
        if "inner" in options and size > 1 and shm.node_phases_by_default(
                call.open(), inner, opname, recv.dtype, recv.nbytes):
            options = {**options, "inner": "shm"}
        prepared = _prepare(call, algo, count, recv.dtype, opname, options)
        call.agree(algo.name, op=opname, dtype=recv.dtype, count=count,
                   inner=options.get("inner"), outer=options.get("outer"),
                   order=options.get("order"), nodes=_nodes(call, algo))
        if algo.library:
            call.mpi(MPI.Comm.Allreduce, MPI.Comm.Iallreduce,
                     MPI.IN_PLACE if send is None else send, recv, op=_OPS[opname])
            return recv
        if isinstance(prepared, SharedMemory):  # from sendbuf (or recvbuf, in place) to recvbuf
            prepared.run((recv if send is None else send).reshape(-1), recv.reshape(-1),
                         call.tag, call.watch, *_shm_signature(call))
            _remember(call, key, prepared, recv.dtype)
            return recv
        if send is not None:        # same element count, any shape: copy over the flat views
            np.copyto(recv.reshape(-1), send.reshape(-1))
        if prepared is not None:
            _run(call, prepared, recv.reshape(-1))
        _remember(call, key, prepared, recv.dtype)
        return recv


def reduce_scatter_block(sendbuf, recvbuf=None, *, op=MPI.SUM, algorithm="auto", comm=None,
                         timeout=None, on_timeout=None, validate=None):
    """Reduce-scatter: rank r gets block r (``sendbuf.size / comm.size`` elements) of the reduction.

    With ``MPI.IN_PLACE`` the input is the whole ``recvbuf`` and the result lands in its first
    block. A new ``recvbuf`` has shape ``sendbuf.shape[1:]`` when ``sendbuf.shape[0]`` equals the
    communicator size, else it is flat.
    """
    key = _key("reduce_scatter_block", sendbuf, recvbuf, op, algorithm, (), timeout, on_timeout,
               validate)
    if key is not None:
        st, entry = _prepared(comm, key)
        if entry is not None and _checked(sendbuf, recvbuf):
            n, rank = entry.block, entry.rank
            work = recvbuf.reshape(-1) if sendbuf is MPI.IN_PLACE else sendbuf.reshape(-1).copy()
            entry(st, work)
            np.copyto(recvbuf.reshape(-1)[:n], work[rank * n:(rank + 1) * n])
            return recvbuf
    with Call("reduce_scatter_block", algorithm, comm, timeout, on_timeout, validate) as call:
        opname = _op_name(op)
        algo = _algorithm("reduce_scatter_block", algorithm)
        comm = call.comm
        size = comm.Get_size()
        send, recv, total, n = _reduce_scatter_buffers(sendbuf, recvbuf, size)
        _check_op(call.collective, opname, recv.dtype, algo)
        auto = algo is None
        _local_checks(algo, opname, {})
        if auto:
            algo = _unless_library_lacks("reduce_scatter_block", lookup(
                "reduce_scatter_block", select.reduce_scatter_block(total * recv.itemsize, size)),
                recv.dtype, opname, total * recv.itemsize, size, total)
        options = _options(call, algo, {}, auto)
        prepared = _prepare(call, algo, total if n else 0, recv.dtype, opname, options)
        work = None
        if not algo.library:        # the whole input, reduced in place (sendbuf is not modified)
            work = recv.reshape(-1) if send is None else send.reshape(-1).copy()
        call.agree(algo.name, op=opname, dtype=recv.dtype, count=n)
        if algo.library:
            call.mpi(MPI.Comm.Reduce_scatter_block, MPI.Comm.Ireduce_scatter_block,
                     MPI.IN_PLACE if send is None else send, recv, op=_OPS[opname])
            return recv
        if prepared is not None:
            _run(call, prepared, work)
        rank = comm.Get_rank()
        np.copyto(recv.reshape(-1)[:n], work[rank * n:(rank + 1) * n])
        _remember(call, key, prepared, recv.dtype, n)
        return recv


def allgather(sendbuf, recvbuf=None, *, algorithm="auto", comm=None, timeout=None,
              on_timeout=None, validate=None):
    """All-gather: every rank gets all ranks' ``sendbuf`` concatenated in rank order.

    With ``MPI.IN_PLACE`` rank r's input is block r of ``recvbuf``. A new ``recvbuf`` has shape
    ``(comm.size,) + sendbuf.shape``.
    """
    key = _key("allgather", sendbuf, recvbuf, "", algorithm, (), timeout, on_timeout, validate)
    if key is not None:
        st, entry = _prepared(comm, key)
        if entry is not None and _checked(sendbuf, recvbuf):
            n, rank = entry.block, entry.rank
            flat = recvbuf.reshape(-1)
            if sendbuf is not MPI.IN_PLACE:
                np.copyto(flat[rank * n:(rank + 1) * n], sendbuf.reshape(-1))
            entry(st, flat)
            return recvbuf
    with Call("allgather", algorithm, comm, timeout, on_timeout, validate) as call:
        algo = _algorithm("allgather", algorithm)
        comm = call.comm
        size, rank = comm.Get_size(), comm.Get_rank()
        send, recv, n = _allgather_buffers(sendbuf, recvbuf, size)
        auto = algo is None
        _local_checks(algo, None, {})
        if auto:
            algo = lookup("allgather", select.allgather(recv.nbytes, size))
        options = _options(call, algo, {}, auto)
        prepared = _prepare(call, algo, recv.size if n else 0, recv.dtype, None, options)
        call.agree(algo.name, dtype=recv.dtype, count=n)
        if algo.library:
            call.mpi(MPI.Comm.Allgather, MPI.Comm.Iallgather,       # bfloat16: as uint16
                     MPI.IN_PLACE if send is None else kernels.as_storage(send),
                     kernels.as_storage(recv))
            return recv
        flat = recv.reshape(-1)
        if send is not None:
            np.copyto(flat[rank * n:(rank + 1) * n], send.reshape(-1))
        if prepared is not None:
            _run(call, prepared, flat)
        _remember(call, key, prepared, recv.dtype, n)
        return recv


def bcast(buf, root=0, *, algorithm="auto", comm=None, timeout=None, on_timeout=None,
          validate=None):
    """Broadcast ``buf`` from ``root`` to every rank, in place. Returns ``buf``."""
    key = None if type(root) is not int else _key(
        "bcast", MPI.IN_PLACE, buf, "", algorithm, (root,), timeout, on_timeout, validate)
    if key is not None:
        st, entry = _prepared(comm, key)
        if entry is not None and _checked(MPI.IN_PLACE, buf):
            entry(st, buf)
            return buf
    with Call("bcast", algorithm, comm, timeout, on_timeout, validate) as call:
        algo = _algorithm("bcast", algorithm)
        comm = call.comm
        buf = _array(buf, "buf", writable=True)
        size = comm.Get_size()
        root = _root(root, size)
        _local_checks(algo, None, {})
        if algo is None:
            algo = lookup("bcast", select.bcast(buf.nbytes, size))
        options = {**_options(call, algo, {}), "root": root}
        prepared = _prepare(call, algo, buf.size, buf.dtype, None, options)
        call.agree(algo.name, dtype=buf.dtype, count=buf.size, root=root)
        if algo.library:
            call.mpi(MPI.Comm.Bcast, MPI.Comm.Ibcast, kernels.as_storage(buf), root=root)
            return buf
        if prepared is not None:
            _run(call, prepared, buf.reshape(-1))
        _remember(call, key, prepared, buf.dtype)
        return buf


# ----------------------------------------------------------------------------- nonblocking

def _request(call: Call, algo: Algorithm, flat: np.ndarray, op: str | None, options: dict, *,
             codec=None, on_done=None, result=None, what: str | None = None) -> Request:
    """A request that runs ``algo`` on ``flat`` in the progress executor
    (``executors/progress.py``), not started yet (``op=None``: nothing is reduced). It runs
    on the storage view of ``flat`` (``kernels.storage``: mpi4py can't send bfloat16)."""
    sched, _, options, nodes = _scheduled(call, algo, flat.size, options)
    op = op or kernels.ops_for(flat.dtype)[0]
    _warmup(call, op, flat.dtype)
    if codec is not None:
        compression.warmup()
    return Request(what or f"{call.collective} {algo.name}", sched, kernels.as_storage(flat),
                   reduce_into=kernels.kernel(op, flat.dtype), codec=codec,
                   cuts=_cuts(algo, call.comm.Get_size(), flat.size, options, codec, nodes),
                   on_done=on_done, result=result)


def _start(call: Call, algo: Algorithm, flat: np.ndarray, op: str | None, options: dict,
           **kwargs) -> Request:
    """Start ``algo`` on ``flat`` in the progress executor."""
    return _request(call, algo, flat, op, options, **kwargs).start(call, call.open().traffic)


def _cuts(algo: Algorithm, size: int, count: int, options: dict, codec, nodes=None):
    """int8's pieces for ``algo`` on this communicator (``compression.schedule_cuts``): cut at
    every slice edge of every rank's schedule."""
    if codec is None or codec.name != "int8":
        return None
    return _cached_cuts(algo, size, count, tuple(options.items()), nodes)


@functools.lru_cache(maxsize=64)
def _cached_cuts(algo: Algorithm, size: int, count: int, options: tuple, nodes):
    return compression.schedule_cuts(
        count, [_plan(algo, r, size, count, options, nodes)[0] for r in range(size)])


def _start_library(call: Call, algo: Algorithm, nonblocking, *args, result, **kwargs) -> Request:
    """The MPI library's own nonblocking collective (``MPI.Comm.Iallreduce``...) as a Request."""
    call.open()
    req = Request(f"{call.collective} {algo.name}", result=result,
                  library=lambda comm: nonblocking(comm, *args, **kwargs))
    return req.start(call, call.open().traffic)


def iallreduce(sendbuf, recvbuf=None, *, op=MPI.SUM, algorithm="auto", comm=None,
               inner: str | None = None, outer: str | None = None, order: str | None = None,
               compress=None,
               error_feedback=None, timeout=None, on_timeout=None, validate=None) -> Request:
    """Start an all-reduce; returns a ``Request`` (``wait()`` returns ``recvbuf``).

    Arguments as ``allreduce``. Do not touch ``sendbuf`` or ``recvbuf`` until the request is
    done. ``compress="bf16" | "fp16" | "int8"`` sends fp32 data narrowed and reduces in fp32 at
    each hop (``mpicoll.compression``: where it rounds, and why every rank still ends with the
    same bits); ``error_feedback=ErrorFeedback(n)`` adds the residual of the previous call
    into this one's input first. Compression needs float32 and ``op="sum"``.
    ``timeout`` runs from this call; ``validate=True`` agrees here, before the request starts.
    """
    with Call("allreduce", algorithm, comm, timeout, on_timeout, validate) as call:
        opname = _op_name(op)
        algo = _algorithm("allreduce", algorithm)
        comm = call.comm
        send, recv = _buffers(sendbuf, recvbuf, lambda n: n, lambda s: s.shape)
        _check_op(call.collective, opname, recv.dtype, algo)
        codec = compression.codec(compress)
        if error_feedback is not None and not isinstance(error_feedback,
                                                         compression.ErrorFeedback):
            raise TypeError(f"error_feedback must be an mpicoll.ErrorFeedback, got "
                            f"{type(error_feedback).__name__}")
        if error_feedback is not None and codec is None:
            raise ValueError("error_feedback needs a compress= mode (it keeps the rounding error)")
        if codec is not None:
            if recv.dtype != np.float32 or opname != "sum":
                raise ValueError(f"compress={compress!r} needs float32 data and op='sum', got "
                                 f"{recv.dtype} and op={opname!r}")
            if algo is not None and algo.library:
                raise ValueError(f"compress={compress!r} needs one of mpicoll's algorithms, "
                                 f"not the MPI library's own {algo.name!r}")
        if error_feedback is not None and error_feedback.residual.size != recv.size:
            raise ValueError(f"error_feedback holds {error_feedback.residual.size} elements, "
                             f"the buffer has {recv.size}")
        given = {"inner": inner, "outer": outer, "order": order}
        auto = algo is None
        if auto and (inner or outer or order):
            raise ValueError("inner/outer/order apply only to an algorithm that declares them, "
                             "not to 'auto'")
        if algo is not None and algo.has("shared-memory"):
            raise ValueError(f"algorithm={algo.name!r} has no nonblocking form; call allreduce "
                             "or allreduce_init")
        if inner == "shm":
            raise ValueError("hierarchical inner='shm' has no nonblocking form; call allreduce "
                             "or allreduce_init")
        _local_checks(algo, opname, given)
        size, count = comm.Get_size(), recv.size
        if auto:
            algo = _unless_library_lacks("allreduce", lookup("allreduce", select.allreduce(
                recv.nbytes, size, count, call.open().ranks_per_node if size > 1 else None)),
                recv.dtype, opname, recv.nbytes, size, count)
            if algo.library and codec is not None:      # compression needs a schedule
                algo = lookup("allreduce", "ring")
        options = _options(call, algo, given, auto)
        call.agree(algo.name, op=opname, dtype=recv.dtype, count=count,
                   inner=options.get("inner"), outer=options.get("outer"),
                   order=options.get("order"), nodes=_nodes(call, algo), compress=compress)
        if algo.library:
            return _start_library(call, algo, MPI.Comm.Iallreduce,
                                  MPI.IN_PLACE if send is None else send, recv,
                                  op=_OPS[opname], result=recv)
        if send is not None:
            np.copyto(recv.reshape(-1), send.reshape(-1))
        if size == 1 or count == 0:
            return Request("allreduce", result=recv)
        req = _request(call, algo, recv.reshape(-1), opname, options, codec=codec, result=recv)
        if error_feedback is not None:
            error_feedback.apply(codec, recv.reshape(-1), req._cuts)
        return req.start(call, call.open().traffic)


def ireduce_scatter_block(sendbuf, recvbuf=None, *, op=MPI.SUM, algorithm="auto", comm=None,
                          timeout=None, on_timeout=None, validate=None) -> Request:
    """Start a reduce-scatter (arguments as ``reduce_scatter_block``); returns a ``Request``."""
    with Call("reduce_scatter_block", algorithm, comm, timeout, on_timeout, validate) as call:
        opname = _op_name(op)
        algo = _algorithm("reduce_scatter_block", algorithm)
        comm = call.comm
        size, rank = comm.Get_size(), comm.Get_rank()
        send, recv, total, n = _reduce_scatter_buffers(sendbuf, recvbuf, size)
        _check_op(call.collective, opname, recv.dtype, algo)
        _local_checks(algo, opname, {})
        if algo is None:
            algo = _unless_library_lacks("reduce_scatter_block", lookup(
                "reduce_scatter_block", select.reduce_scatter_block(total * recv.itemsize, size)),
                recv.dtype, opname, total * recv.itemsize, size, total)
        options = _options(call, algo, {})
        call.agree(algo.name, op=opname, dtype=recv.dtype, count=n)
        if algo.library:
            return _start_library(call, algo, MPI.Comm.Ireduce_scatter_block,
                                  MPI.IN_PLACE if send is None else send, recv,
                                  op=_OPS[opname], result=recv)
        work = recv.reshape(-1) if send is None else send.reshape(-1).copy()

        def own_block():
            np.copyto(recv.reshape(-1)[:n], work[rank * n:(rank + 1) * n])

        if size == 1 or n == 0:
            own_block()
            return Request("reduce_scatter_block", result=recv)
        return _start(call, algo, work, opname, options, on_done=own_block, result=recv)


def iallgather(sendbuf, recvbuf=None, *, algorithm="auto", comm=None, timeout=None,
               on_timeout=None, validate=None) -> Request:
    """Start an all-gather (arguments as ``allgather``); returns a ``Request``."""
    with Call("allgather", algorithm, comm, timeout, on_timeout, validate) as call:
        algo = _algorithm("allgather", algorithm)
        comm = call.comm
        size, rank = comm.Get_size(), comm.Get_rank()
        send, recv, n = _allgather_buffers(sendbuf, recvbuf, size)
        _local_checks(algo, None, {})
        if algo is None:
            algo = lookup("allgather", select.allgather(recv.nbytes, size))
        options = _options(call, algo, {})
        call.agree(algo.name, dtype=recv.dtype, count=n)
        if algo.library:
            return _start_library(call, algo, MPI.Comm.Iallgather,
                                  MPI.IN_PLACE if send is None else kernels.as_storage(send),
                                  kernels.as_storage(recv), result=recv)
        flat = recv.reshape(-1)
        if send is not None:
            np.copyto(flat[rank * n:(rank + 1) * n], send.reshape(-1))
        if size == 1 or n == 0:
            return Request("allgather", result=recv)
        return _start(call, algo, flat, None, options, result=recv)


def ibcast(buf, root=0, *, algorithm="auto", comm=None, timeout=None, on_timeout=None,
           validate=None) -> Request:
    """Start a broadcast of ``buf`` from ``root``, in place; returns a ``Request``."""
    with Call("bcast", algorithm, comm, timeout, on_timeout, validate) as call:
        algo = _algorithm("bcast", algorithm)
        comm = call.comm
        buf = _array(buf, "buf", writable=True)
        size = comm.Get_size()
        root = _root(root, size)
        _local_checks(algo, None, {})
        if algo is None:
            algo = lookup("bcast", select.bcast(buf.nbytes, size))
        options = {**_options(call, algo, {}), "root": root}
        call.agree(algo.name, dtype=buf.dtype, count=buf.size, root=root)
        if algo.library:
            return _start_library(call, algo, MPI.Comm.Ibcast, kernels.as_storage(buf),
                                  root=root, result=buf)
        if size == 1 or buf.size == 0:
            return Request("bcast", result=buf)
        return _start(call, algo, buf.reshape(-1), None, options, result=buf)
