"""``ProcessGroupMpicoll``: torch.distributed's collectives on CPU tensors, run by mpicoll.

Supported (the torch call -> the mpicoll call, on the tensors' own memory):

    all_reduce (SUM PRODUCT MIN MAX BAND BOR BXOR AVG)   iallreduce / allreduce, in place
    all_reduce_coalesced                                 one iallreduce over the packed tensors
    reduce_scatter_tensor                                ireduce_scatter_block(input, output)
    reduce_scatter (list form)                           the same, inputs packed first
    all_gather_into_tensor                               iallgather(input, output)
    all_gather (list form)                               iallgather, then copied to the list
    broadcast                                            ibcast, in place
    barrier                                              a one-byte iallreduce

Everything else (reduce, gather, scatter, all_to_all, send/recv, the *_coalesced gathers and
scatters, monitored_barrier, PREMUL_SUM) raises ``NotImplementedError`` naming the op.

Tensors: contiguous CPU tensors are viewed as numpy arrays (``Tensor.numpy()``, bfloat16 as
``ml_dtypes.bfloat16`` over an int16 view): no copy, the result lands in the tensor. Others get
a ``TypeError`` (not on the CPU, sparse, a dtype mpicoll lacks) or a ``ValueError``
(non-contiguous). float16 and bfloat16 are reduced by mpicoll's kernels (in float32, rounded
once). AVG is SUM, then division by the group size on every rank (floating types only, as
NCCL; Gloo has no AVG): mpicoll's ``average=True``, in the call's signature, so a rank passing
AVG where the others pass SUM raises ``ArgumentMismatch`` on every rank (with
``Options.reproducible`` the backend divides the reproducible sum itself, outside it). On bool
tensors SUM and MAX and BOR are logical or, PRODUCT and MIN and BAND logical and, BXOR logical
xor (NCCL's reading).

Asynchrony: torch passes ``opts.asyncOp``. ``async_op=True`` -- and every call DDP makes --
starts mpicoll's nonblocking call (``iallreduce``...); the progress thread runs it while the
caller computes, and the returned ``Work``'s future completes when the request does: the
thread that ends the request (the progress thread, most often) completes the future of a
``Work`` whose future was asked for, as DDP asks, once it has let the engine go
(``Request.then``: no thread of the backend's own, no hand-off); ``Work.wait()`` waits in
the caller's thread. A small all_reduce (at most ``SMALL`` bytes, not reproducible) runs the
prepared call the group keeps for the tensor's memory, shape, dtype, op and algorithm, as a
persistent request would -- each start a new call, agreed as any -- and the caller's thread
looks at it for ``FIRST_LOOK`` seconds before handing it to the progress thread: when the peers
are there it ends in the call, and the ``Work`` comes back finished. ``async_op=False`` runs
mpicoll's blocking call (its fast paths: persistent plans, the compiled executor, ``shm``) and
returns a finished ``Work``. Without ``MPI_THREAD_MULTIPLE`` (no progress thread) every call
is blocking. So are the calls of an algorithm whose nonblocking form would only defer it
(``registry.Algorithm.deferred``: ``shm``, which the progress engine runs whole).

Errors: bad arguments raise at the call, before any communication (``TypeError`` /
``ValueError``, as Gloo's). A collective that fails -- ``CollectiveTimeout`` naming the ranks
it waited for, ``CommunicatorBroken``, ``ArgumentMismatch`` -- fails its ``Work``:
``Work.wait()`` and ``Work.get_future().wait()`` raise ``RuntimeError`` with mpicoll's message,
the mpicoll exception as ``__cause__`` (c10d's convention: DDP and ``dist.all_reduce`` raise
``RuntimeError`` from any backend).
"""

from __future__ import annotations

import collections
import functools
from dataclasses import dataclass
from datetime import timedelta

import numpy as np
import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d
from mpi4py import MPI

import mpicoll
from mpicoll import buffers, dtypes, ops, plan, registry, settings
from mpicoll._runtime.call import Call
from mpicoll.errors import ArgumentMismatch, CollectiveTimeout, CommunicatorBroken
from mpicoll.executors import background

from .work import Work, _completer, _error_of, _seconds

__all__ = ["NAME", "Options", "ProcessGroupMpicoll", "Work", "register", "tensor_view"]

NAME = "mpicoll"
_RED = dist.ReduceOp
# keyed by the RedOpType's int value: hashing pybind11's enum costs more than the call's rest
_OPS = {int(k): v for k, v in {
    _RED.SUM: "sum", _RED.PRODUCT: "prod", _RED.MIN: "min", _RED.MAX: "max",
    _RED.BAND: "band", _RED.BOR: "bor", _RED.BXOR: "bxor", _RED.AVG: "sum"}.items()}
_BOOL_OPS = {int(k): v for k, v in {
    _RED.SUM: "lor", _RED.MAX: "lor", _RED.BOR: "lor", _RED.PRODUCT: "land",
    _RED.MIN: "land", _RED.BAND: "land", _RED.BXOR: "lxor"}.items()}
_AVG = int(_RED.AVG)
_FAILURES = (CollectiveTimeout, CommunicatorBroken, ArgumentMismatch)
_SUPPORTED = ("all_reduce, all_reduce_coalesced, reduce_scatter_tensor, reduce_scatter, "
              "all_gather_into_tensor, all_gather, broadcast, barrier")
SMALL = 64 << 10        # an async all_reduce of at most this many bytes runs a kept call ...
KEPT = 16               # ... one of this many per group (least recently used dropped) ...
FIRST_LOOK = 50e-6      # ... looked at this long in the caller's thread before the hand-off
_epoch = 0              # settings.reload() bumps it: the kept calls' decisions are stale


@settings.on_reload
def _new_epoch() -> None:
    global _epoch
    _epoch += 1


@dataclass
class Options:
    """What ``init_process_group("mpicoll", pg_options=Options(...))`` (or ``new_group``) sets.

    ``algorithm``: as ``mpicoll.Comm``'s (``mpicoll.registry.per_collective``): a name applies
    to every collective that has an algorithm of that name, the others run ``"auto"``
    (``"recursive_doubling"``: all_reduce and the all-gathers); a dict ``{collective:
    algorithm}`` over ``"allreduce"``, ``"reduce_scatter_block"``, ``"allgather"``, ``"bcast"``
    names them one by one (missing ones: ``"auto"``). A name no collective has, or a collective
    that is not one, raises ``ValueError`` at the next call. ``timeout``: seconds, overriding
    ``init_process_group(timeout=)``'s for every call of the group. ``reproducible``: True (or
    K, the slices per value) makes every floating-point SUM and AVG of ``all_reduce`` (and its
    coalesced form) and of the reduce-scatters give the same bits whatever the world size,
    algorithm or node layout (``mpicoll.reproducible``); other ops and integer tensors are
    exact already and run as usual; a floating-point PRODUCT raises ``ValueError``.
    """

    algorithm: str | dict = "auto"
    timeout: float | None = None
    reproducible: bool | int = False

    def reproducible_for(self, view: np.ndarray, op: str) -> dict:
        """``{"reproducible": ...}`` for a reduction ``op`` of ``view``'s dtype, or ``{}``
        (``mpicoll.ops.reproducible_for``: the rule ``mpicoll.Comm`` follows too)."""
        value = ops.reproducible_setting(self.reproducible, "Options")
        return ops.reproducible_for(value, view.dtype, op, "Options")

    def algorithm_for(self, collective: str) -> str:
        """The algorithm ``collective`` (``"allreduce"`` ...) runs with."""
        return registry.algorithm_for(self.algorithm, collective, "Options")


# ----------------------------------------------------------------------------- tensors

def tensor_view(t, what: str = "tensor", *, read_only: bool = False) -> np.ndarray:
    """A numpy array over ``t``'s memory (no copy), or a ``TypeError`` / ``ValueError`` naming
    what is wrong with ``t``. A lazy conjugate or negative view (``t.is_conj()``,
    ``t.is_neg()``: its memory holds other values than it shows) is resolved into a copy when
    ``read_only``, and refused otherwise: a result written into the copy would be lost."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{what} must be a torch.Tensor, got {type(t).__name__}")
    if t.device.type != "cpu":
        raise TypeError(f"{what} is on {t.device}: the mpicoll backend reduces CPU tensors; "
                        f"use .cpu() (a copy), or the 'nccl' backend for CUDA tensors")
    if t.layout != torch.strided:
        raise TypeError(f"{what} has layout {t.layout}: the mpicoll backend takes dense tensors")
    if not t.is_contiguous():
        raise ValueError(f"{what} is not contiguous (shape {tuple(t.shape)}, stride "
                         f"{t.stride()}): the mpicoll backend works in place on the tensor's "
                         f"memory; pass t.contiguous() (a copy) and copy the result back")
    if t.requires_grad:
        t = t.detach()
    lazy = "conj" if t.is_conj() else "neg" if t.is_neg() else None
    if lazy is not None:
        if not read_only:
            raise ValueError(f"{what} is a lazy {'conjugate' if lazy == 'conj' else 'negative'} "
                             f"view (its memory holds other values than it shows): the mpicoll "
                             f"backend writes the result into the tensor's memory; pass "
                             f"t.resolve_{lazy}() (a copy) and copy the result back")
        t = t.resolve_conj().resolve_neg()
    if t.dtype == torch.bfloat16:       # numpy has no bfloat16: its int16 bits, as ml_dtypes'
        return t.view(torch.int16).numpy().view(dtypes.bfloat16)     # (imports ml_dtypes)
    try:
        return t.numpy()
    except (TypeError, RuntimeError) as exc:
        raise TypeError(f"{what} has dtype {t.dtype}, which the mpicoll backend cannot "
                        f"reduce ({exc})") from None


def _op(opts, t) -> tuple[str, bool]:
    """mpicoll's op name for ``opts.reduceOp`` on ``t``, and whether to divide (AVG)."""
    op = opts.reduceOp
    kind = int(op.op if hasattr(op, "op") else op)
    name = _OPS.get(kind)
    if name is None:
        raise NotImplementedError(f"the mpicoll backend does not implement ReduceOp "
                                  f"{_RED.RedOpType(kind)}")
    if kind == _AVG:
        if not (t.is_floating_point() or t.is_complex()):
            raise TypeError(f"ReduceOp.AVG needs a floating-point tensor, got {t.dtype}")
        return name, True
    if t.dtype == torch.bool:
        return _BOOL_OPS[kind], False
    return name, False


# ----------------------------------------------------------------------------- the group

class ProcessGroupMpicoll(dist.ProcessGroup):
    """A torch process group whose collectives are mpicoll's, on the MPI communicator ``comm``.

    ``options`` (``Options``) may be changed between calls (``dist.group.WORLD.options``).
    """

    def __init__(self, comm, rank: int, size: int, timeout: float | None,
                 options: Options | None = None):
        super().__init__(rank, size)
        self.comm = comm
        self._size = size
        self.options = options if options is not None else Options()
        self.timeout = timeout
        self.threaded = MPI.Query_thread() >= MPI.THREAD_MULTIPLE
        self._kept: collections.OrderedDict = collections.OrderedDict()    # _iallreduce's

    def __repr__(self) -> str:
        return (f"<ProcessGroupMpicoll rank {self.rank()} of {self.size()}, "
                f"algorithm={self.options.algorithm!r}, timeout={self._timeout()}>")

    def getBackendName(self) -> str:
        return NAME

    # ---------------------------------------------------------------- plumbing

    def _timeout(self, opts=None) -> float | None:
        per_call = _seconds(getattr(opts, "timeout", None))
        if per_call is not None:
            return per_call
        return self.options.timeout if self.options.timeout is not None else self.timeout

    def _submit(self, what: str, calls, result, opts, *, after=None, deferred=False) -> Work:
        """Run ``calls`` -- each ``call(blocking)`` runs one mpicoll collective and returns its
        Request (or None when blocking) -- and wrap them in a Work; blocking when torch asks
        for it, without a progress thread, or for an algorithm whose nonblocking form is only
        ``deferred`` (``registry.Algorithm.deferred``: ``shm``)."""
        blocking = not getattr(opts, "asyncOp", True) or not self.threaded or deferred
        if blocking:
            try:
                for call in calls:
                    call(True)
            except _FAILURES as exc:
                return Work(what, result=result, after=after, error=exc)
            return Work(what, result=result, after=after)
        requests = []
        for call in calls:
            try:
                requests.append(call(False))
            except _FAILURES as exc:
                return Work(what, result=result, error=exc)
        if all(r.done for r in requests):   # ended at the start: one rank, no elements, or
            return Work(what, result=result, after=after,     # in _iallreduce's first look
                        error=_error_of(requests))
        work = Work(what, requests, result, after)
        _completer.track(work)          # for drain(); get_future() or wait() completes it
        return work

    def _kwargs(self, collective: str, opts) -> dict:
        return {"algorithm": self.options.algorithm_for(collective), "comm": self.comm,
                "timeout": self._timeout(opts)}

    @staticmethod
    def _deferred(collective: str, kw: dict) -> bool:
        """Whether ``kw``'s algorithm is one whose nonblocking form is only deferred."""
        algorithm = kw["algorithm"]
        return algorithm != "auto" and registry.lookup(collective, algorithm).deferred

    # ---------------------------------------------------------------- collectives

    def allreduce(self, tensors, opts=None):
        opts = dist.AllreduceOptions() if opts is None else opts
        return self._allreduce("all_reduce", tensors, tensors, opts)

    def _allreduce(self, what: str, tensors, result, opts, after=None):
        kw = self._kwargs("allreduce", opts)
        calls, averaged = [], []
        for t in tensors:
            view = tensor_view(t, f"{what} tensor")
            op, average = _op(opts, t)
            exact = self.options.reproducible_for(view, op)
            if average and exact:       # (mpicoll's average=True is not for reproducible sums)
                averaged.append(t)
            signed = {"average": True} if average and not exact else {}

            def call(blocking, t=t, view=view, op=op, exact=exact, signed=signed):
                if blocking:
                    mpicoll.allreduce(MPI.IN_PLACE, view, op=op, **kw, **exact, **signed)
                    return None
                if exact or view.nbytes > SMALL:
                    return mpicoll.iallreduce(MPI.IN_PLACE, view, op=op, **kw, **exact,
                                              **signed)
                return self._iallreduce(t.data_ptr(), view, op, kw, bool(signed))
            calls.append(call)
        size = self._size

        def finish():
            for t in averaged:
                t.div_(size)
            if after is not None:
                after()
        return self._submit(what, calls, result, opts,
                            after=finish if averaged or after is not None else None,
                            deferred=self._deferred("allreduce", kw))

    def _iallreduce(self, address: int, view: np.ndarray, op: str, kw: dict,
                    average: bool):
        """``mpicoll.iallreduce(MPI.IN_PLACE, view, ...)`` of a small ``view`` (at ``address``),
        as a persistent request would run it: through the prepared call kept for the same
        memory, shape, dtype, op and algorithm (made by the first such call, ``KEPT`` per
        group), started anew as a new call, agreed as any (``Prepared.hold``, ``start``); looked
        at ``FIRST_LOOK`` seconds in this thread before the progress thread gets it, so that a
        call whose peers are there ends here. A first call on the communicator, or one whose
        kept call is still in flight, is a plain ``iallreduce``."""
        algorithm = kw["algorithm"]
        key = (address, view.shape, view.dtype, op, algorithm, average, _epoch)
        kept = self._kept.get(key)
        if kept is None or kept.held.done:
            with Call("allreduce", algorithm, self.comm, kw["timeout"], None, None) as call:
                if kept is None and background.ready_now(call):
                    layout = buffers.allreduce(MPI.IN_PLACE, view)
                    p = plan.make(call, "allreduce", algorithm, layout, op=op,
                                  form="nonblocking", average=average)
                    kept = self._keep(key, plan.prepare(call, p).hold(call, layout))
                if kept is not None:
                    self._kept.move_to_end(key)
                    return kept.start(call, first=FIRST_LOOK)
        return mpicoll.iallreduce(MPI.IN_PLACE, view, op=op, **kw, average=average)

    def _keep(self, key, prepared):
        """Keep ``prepared`` for ``key``, dropping the least recently used beyond ``KEPT``."""
        self._kept[key] = prepared
        if len(self._kept) > KEPT:
            self._kept.popitem(last=False)[1].free()
        return prepared

    def allreduce_coalesced(self, tensors, opts=None):
        opts = dist.AllreduceCoalescedOptions() if opts is None else opts
        if not tensors:
            return Work("all_reduce_coalesced", result=tensors)
        dtypes = {t.dtype for t in tensors}
        if len(dtypes) > 1:
            raise TypeError(f"all_reduce_coalesced needs tensors of one dtype, got "
                            f"{sorted(str(d) for d in dtypes)}")
        for i, t in enumerate(tensors):
            tensor_view(t, f"all_reduce_coalesced tensor {i}")
        packed = torch.cat([t.reshape(-1) for t in tensors])    # one collective, as Gloo

        def unpack():
            offset = 0
            for t in tensors:
                t.copy_(packed[offset:offset + t.numel()].view_as(t))
                offset += t.numel()
        return self._allreduce("all_reduce_coalesced", [packed], tensors, opts, after=unpack)

    def broadcast(self, tensors, opts=None):
        opts = dist.BroadcastOptions() if opts is None else opts
        kw = self._kwargs("bcast", opts)
        root = opts.rootRank
        calls = []
        for t in tensors:
            view = tensor_view(t, "broadcast tensor")

            def call(blocking, view=view):
                if blocking:
                    mpicoll.bcast(view, root, **kw)
                    return None
                return mpicoll.ibcast(view, root, **kw)
            calls.append(call)
        return self._submit("broadcast", calls, tensors, opts,
                            deferred=self._deferred("bcast", kw))

    def barrier(self, opts=None):
        opts = dist.BarrierOptions() if opts is None else opts
        _completer.drain()              # as Gloo's: after this group's work in flight
        token = np.zeros(1, np.uint8)
        kw = {**self._kwargs("allreduce", opts), "algorithm": "auto"}

        def call(blocking):
            if blocking:
                mpicoll.allreduce(token, op="max", **kw)
                return None
            return mpicoll.iallreduce(token, op="max", **kw)
        return self._submit("barrier", [call], [], opts)

    def all_gather_single(self, output, input, opts=None):
        src, dst = tensor_view(input, "all_gather_into_tensor input", read_only=True), \
            tensor_view(output, "all_gather_into_tensor output")
        if input.dtype != output.dtype:
            raise TypeError(f"all_gather_into_tensor: output dtype {output.dtype} differs from "
                            f"input dtype {input.dtype}")
        if output.numel() != self.size() * input.numel():
            raise ValueError(f"all_gather_into_tensor: output has {output.numel()} elements, "
                             f"expected {self.size()} x {input.numel()}")
        kw = self._kwargs("allgather", opts)

        def call(blocking):
            if blocking:
                mpicoll.allgather(src, dst, **kw)
                return None
            return mpicoll.iallgather(src, dst, **kw)
        return self._submit("all_gather_into_tensor", [call], [output], opts,
                            deferred=self._deferred("allgather", kw))

    _allgather_base = all_gather_single

    def allgather(self, output_lists, inputs, opts=None):
        calls, copies = [], []
        size = self.size()
        kw = self._kwargs("allgather", opts)
        for outputs, t in zip(output_lists, inputs):
            src = tensor_view(t, "all_gather input", read_only=True)
            if len(outputs) != size:
                raise ValueError(f"all_gather: {len(outputs)} output tensors for a group of "
                                 f"{size}")
            for r, o in enumerate(outputs):
                if o.numel() != t.numel() or o.dtype != t.dtype:
                    raise ValueError(f"all_gather: output {r} is {o.dtype} x {o.numel()}, the "
                                     f"input {t.dtype} x {t.numel()}")
                if o.device.type != "cpu":
                    raise TypeError(f"all_gather output {r} is on {o.device}, not the CPU")
            gathered = torch.empty(size * t.numel(), dtype=t.dtype)
            dst = tensor_view(gathered)
            copies.append((outputs, gathered, t.numel()))

            def call(blocking, src=src, dst=dst):
                if blocking:
                    mpicoll.allgather(src, dst, **kw)
                    return None
                return mpicoll.iallgather(src, dst, **kw)
            calls.append(call)

        def unpack():
            for outputs, gathered, n in copies:
                for r, o in enumerate(outputs):
                    o.copy_(gathered[r * n:(r + 1) * n].view_as(o))
        return self._submit("all_gather", calls, output_lists, opts, after=unpack,
                            deferred=self._deferred("allgather", kw))

    def reduce_scatter_single(self, output, input, opts=None):
        opts = dist.ReduceScatterOptions() if opts is None else opts
        src = tensor_view(input, "reduce_scatter_tensor input", read_only=True)
        dst = tensor_view(output, "reduce_scatter_tensor output")
        if input.dtype != output.dtype:
            raise TypeError(f"reduce_scatter_tensor: output dtype {output.dtype} differs from "
                            f"input dtype {input.dtype}")
        if input.numel() != self.size() * output.numel():
            raise ValueError(f"reduce_scatter_tensor: input has {input.numel()} elements, "
                             f"expected {self.size()} x {output.numel()}")
        return self._reduce_scatter("reduce_scatter_tensor", [(src, dst, output)], [output],
                                    opts)

    _reduce_scatter_base = reduce_scatter_single

    def reduce_scatter(self, outputs, input_lists, opts=None):
        opts = dist.ReduceScatterOptions() if opts is None else opts
        size, triples = self.size(), []
        for output, inputs in zip(outputs, input_lists):
            dst = tensor_view(output, "reduce_scatter output")
            if len(inputs) != size:
                raise ValueError(f"reduce_scatter: {len(inputs)} input tensors for a group of "
                                 f"{size}")
            for r, t in enumerate(inputs):
                if t.numel() != output.numel() or t.dtype != output.dtype:
                    raise ValueError(f"reduce_scatter: input {r} is {t.dtype} x {t.numel()}, "
                                     f"the output {output.dtype} x {output.numel()}")
                tensor_view(t, f"reduce_scatter input {r}", read_only=True)
            packed = torch.cat([t.reshape(-1) for t in inputs])
            triples.append((tensor_view(packed), dst, output))
        return self._reduce_scatter("reduce_scatter", triples, outputs, opts)

    def _reduce_scatter(self, what: str, triples, result, opts):
        kw = self._kwargs("reduce_scatter_block", opts)
        calls, averaged = [], []
        for src, dst, output in triples:
            op, average = _op(opts, output)
            exact = self.options.reproducible_for(dst, op)
            if average and exact:       # (mpicoll's average=True is not for reproducible sums)
                averaged.append(output)
            signed = {"average": True} if average and not exact else {}

            def call(blocking, src=src, dst=dst, op=op, exact=exact, signed=signed):
                if blocking:
                    mpicoll.reduce_scatter_block(src, dst, op=op, **kw, **exact, **signed)
                    return None
                return mpicoll.ireduce_scatter_block(src, dst, op=op, **kw, **exact, **signed)
            calls.append(call)
        size = self.size()

        def finish():
            for t in averaged:
                t.div_(size)
        return self._submit(what, calls, result, opts, after=finish,
                            deferred=self._deferred("reduce_scatter_block", kw))

    # ---------------------------------------------------------------- the rest


def _unsupported(torch_name: str):
    def method(self, *args, **kwargs):
        raise NotImplementedError(f"the mpicoll backend does not implement {torch_name}; it "
                                  f"has {_SUPPORTED} (use a 'gloo' group for the rest: "
                                  f"dist.new_group(backend='gloo'))")
    method.__name__ = torch_name
    method.__doc__ = f"Not implemented: raises NotImplementedError naming {torch_name}."
    return method


for _method, _torch_name in {
        "reduce": "reduce", "gather": "gather", "scatter": "scatter",
        "alltoall": "all_to_all", "alltoall_base": "all_to_all_single",
        "all_to_all_single": "all_to_all_single", "send": "send", "recv": "recv",
        "recv_anysource": "recv (from any source)", "allgather_coalesced": "all_gather_coalesced",
        "all_gather_single_coalesced": "all_gather_into_tensor_coalesced",
        "allgather_into_tensor_coalesced": "all_gather_into_tensor_coalesced",
        "reduce_scatter_single_coalesced": "reduce_scatter_tensor_coalesced",
        "reduce_scatter_tensor_coalesced": "reduce_scatter_tensor_coalesced",
        "monitored_barrier": "monitored_barrier"}.items():
    setattr(ProcessGroupMpicoll, _method, _unsupported(_torch_name))


# ----------------------------------------------------------------------------- registration

WORLD = None    # the default group's communicator (None: COMM_WORLD; torch.elastic: survivors')


def _create(backend_options, options):
    """The backend's creator (torch's extended API): the group's MPI communicator."""
    if options is not None and not isinstance(options, Options):
        raise TypeError(f"pg_options for the mpicoll backend must be mpicoll.torch.Options, got "
                        f"{type(options).__name__}")
    world = MPI.COMM_WORLD if WORLD is None else WORLD
    rank, size = backend_options.group_rank, backend_options.group_size
    ranks = list(backend_options.global_ranks_in_group)
    if not ranks:                                   # the default group: all of COMM_WORLD
        if (rank, size) != (world.Get_rank(), world.Get_size()):
            raise RuntimeError(
                f"the mpicoll backend runs over MPI, and torch's rank {rank} of {size} is MPI's "
                f"rank {world.Get_rank()} of {world.Get_size()}: the processes are not one MPI "
                f"job (torchrun starts each as an MPI job of its own). Launch with "
                f"'mpiexec -n {size} python ...' or srun instead (docs/torch.md)")
        comm = world.Dup()
    else:                                           # new_group(ranks): only its members call
        comm = world.Create_group(world.Get_group().Incl(ranks))
        if comm.Get_rank() != rank:
            raise RuntimeError(f"new_group: torch's group rank {rank}, MPI's {comm.Get_rank()}")
    timeout = backend_options.timeout
    seconds = timeout.total_seconds() if isinstance(timeout, timedelta) else None
    return ProcessGroupMpicoll(comm, rank, size, seconds, options)


def register() -> None:
    """Register ``"mpicoll"`` with torch.distributed for CPU tensors (once)."""
    if not hasattr(dist.Backend, NAME.upper()):
        dist.Backend.register_backend(NAME, _create, extended_api=True, devices=["cpu"])
    if not hasattr(dist.monitored_barrier, "mpicoll"):
        dist.monitored_barrier = c10d.monitored_barrier = _monitored_barrier(
            c10d.monitored_barrier)


def _monitored_barrier(original):
    """torch's ``dist.monitored_barrier``, which refuses every backend but Gloo with a
    ValueError of its own before asking the backend: on an mpicoll group, the backend's
    ``NotImplementedError`` instead, as for the other ops it lacks; elsewhere, torch's."""
    @functools.wraps(original)
    def monitored_barrier(*args, **kwargs):
        group = kwargs["group"] if "group" in kwargs else args[0] if args else None
        try:
            ours = dist.is_initialized() and dist.get_backend(group) == NAME
        except (ValueError, RuntimeError):      # not a member of the group: torch's rule
            ours = False
        if ours:
            ProcessGroupMpicoll.monitored_barrier(None)     # raises NotImplementedError
        return original(*args, **kwargs)
    monitored_barrier.mpicoll = True
    return monitored_barrier
