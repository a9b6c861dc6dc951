"""DDP communication hooks on mpicoll's wire compression.

    ddp.register_comm_hook(None, mpicoll.torch.compress_hook("bf16", error_feedback=True))

The hook all-reduces each gradient bucket (fp32) with ``mpicoll.iallreduce(compress=...)``:
bf16 sends half the bytes, int8 a quarter plus one scale per piece, and every hop reduces in
fp32 (``mpicoll.compression``: why every rank still ends with the same bits). With
``error_feedback=True`` each bucket keeps its rounding residual (``mpicoll.ErrorFeedback``)
and adds it into the next step's gradient. Each rank divides its gradient by the group size
before the all-reduce (DDP's mean, taken first as torch's own hooks take it: fp16's sum does
not overflow), with error feedback in the same pass over the bucket. Buckets that are not fp32
are all-reduced uncompressed.

``state``: ``None`` (the default group) or a ``ProcessGroupMpicoll``. The algorithm and
timeout are the group's (``Options``); an algorithm without a schedule (``mpi``, ``shm``)
becomes ``auto``, since compression needs one.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from mpi4py import MPI

import mpicoll
from mpicoll import registry

from .backend import ProcessGroupMpicoll, tensor_view
from .work import Work, _completer

__all__ = ["compress_hook"]

_MODES = ("bf16", "fp16", "int8")


def compress_hook(compress: str = "bf16", *, error_feedback: bool = True):
    """A DDP comm hook ``hook(state, bucket) -> Future[Tensor]`` sending ``compress`` on the
    wire (``"bf16"``, ``"fp16"`` or ``"int8"``), with per-bucket error feedback if asked."""
    if compress not in _MODES:
        raise ValueError(f"compress_hook: compress must be one of {_MODES}, got {compress!r}")
    residuals: dict = {}

    def hook(state, bucket):
        group = state if state is not None else dist.group.WORLD
        if not isinstance(group, ProcessGroupMpicoll):
            raise TypeError(f"mpicoll.torch.compress_hook needs a process group of the mpicoll "
                            f"backend, got {type(group).__name__} (state=None: the default "
                            f"group)")
        grad = bucket.buffer()
        view = tensor_view(grad, "gradient bucket")
        algorithm = group.options.algorithm_for("allreduce")
        if algorithm != "auto" and not registry.lookup("allreduce", algorithm).scheduled:
            algorithm = "auto"          # (compression runs a schedule: not mpi's, not shm's)
        kw = {"algorithm": algorithm, "comm": group.comm, "timeout": group._timeout()}
        size = group.size()
        if grad.dtype != torch.float32:
            grad.div_(size)
            request = mpicoll.iallreduce(MPI.IN_PLACE, view, **kw)
        else:
            ef = None
            if error_feedback:          # (divides as it adds the residual: one pass)
                ef = residuals.get(bucket.index())
                if ef is None or ef.residual.size != view.size or ef.divide != size:
                    # (DDP rebuilt its buckets, or the group is another size: a new mean)
                    ef = residuals[bucket.index()] = mpicoll.ErrorFeedback(view.size,
                                                                           divide=size)
            else:
                grad.div_(size)
            request = mpicoll.iallreduce(MPI.IN_PLACE, view, compress=compress,
                                         error_feedback=ef, **kw)
        work = Work(f"compress_hook({compress!r})", [request], grad)
        if group.threaded:              # (for drain: get_future() completes it)
            _completer.track(work)
        else:                           # no progress thread: finish here (docs/torch.md)
            work._complete()
        return work.get_future()

    hook.__name__ = f"mpicoll_{compress}_hook"
    return hook
