"""Gradient buckets: all-reduce gradients in groups while the backward pass is still running.

    b = mpicoll.Buckets(params, bucket_bytes=25 << 20, op="sum", average=True)
    for step in ...:
        ...backward, last layer first: write gradient i into b.grads[i], then b.ready(i)
        b.wait()                      # b.grads[i] now hold the average over the ranks

PyTorch DDP's design (``torch.nn.parallel.DistributedDataParallel``, "gradient as bucket
view"): the arrays are assigned to buckets in *reverse* order (the backward pass produces the
last layer's gradients first), each bucket is one flat, persistent buffer, and ``grads[i]`` is
a view into it -- the gradient is computed in place, nothing is copied or allocated per step.
When every array of a bucket is ready its all-reduce starts (a persistent ``Request`` of the
progress executor, made once with its scratch and wire buffers), and it runs while the caller
computes the next gradients. Buckets start in bucket order on every rank even if gradients
become ready in another order (a finished bucket waits for the earlier ones), because every
rank must start the same collectives in the same order.

``compress`` and ``error_feedback`` apply per bucket (one ``ErrorFeedback`` residual each).
``average=True`` divides by the number of ranks when a bucket's all-reduce completes.
"""

from __future__ import annotations

import numpy as np
from mpi4py import MPI

from . import compression, kernels, select
from ._runtime.call import Call
from .api import _op_name, _options, _request
from .executors.progress import Request
from .registry import lookup

__all__ = ["Buckets"]


class Buckets:
    """Flat gradient buckets over ``arrays``' shapes; ``grads[i]`` is array i's gradient."""

    def __init__(self, arrays, bucket_bytes: int = 25 << 20, *, op="sum", average=True,
                 comm=None, algorithm="auto", compress=None, error_feedback=False,
                 timeout=None, on_timeout=None, validate=None):
        arrays = list(arrays)
        if not arrays:
            raise ValueError("Buckets needs at least one array")
        dtypes = {np.dtype(a.dtype) for a in arrays}
        if len(dtypes) != 1 or next(iter(dtypes)) not in kernels.DTYPES:
            raise TypeError(f"Buckets needs arrays of one supported dtype, got {sorted(map(str, dtypes))}")
        if isinstance(bucket_bytes, bool) or not isinstance(bucket_bytes, int) or bucket_bytes < 1:
            raise ValueError(f"bucket_bytes must be a positive int, got {bucket_bytes!r}")
        self.op = _op_name(op)
        kernels.check(self.op, next(iter(dtypes)))      # MPI's rule: e.g. no sum on bool
        if average and self.op != "sum":
            raise ValueError(f"average=True needs op='sum', got op={self.op!r}")
        self.comm = MPI.COMM_WORLD if comm is None else comm
        self.dtype = dtypes.pop()
        self.codec = compression.codec(compress)
        if self.codec is not None and (self.dtype != np.float32 or self.op != "sum"):
            raise ValueError(f"compress={compress!r} needs float32 arrays and op='sum'")
        if error_feedback and self.codec is None:
            raise ValueError("error_feedback=True needs a compress= mode")
        self.average, self.algorithm, self.compress = average, algorithm, compress
        self._options = (timeout, on_timeout, validate)

        # Phase 1: assign arrays to buckets, last array first (DDP's order).
        self.buckets: list[tuple] = []          # the array indices of each bucket, in order
        current, nbytes = [], 0
        for i in reversed(range(len(arrays))):
            size = int(np.prod(arrays[i].shape)) * self.dtype.itemsize
            if current and nbytes + size > bucket_bytes:
                self.buckets.append(tuple(current))
                current, nbytes = [], 0
            current.append(i)
            nbytes += size
        self.buckets.append(tuple(current))

        # Phase 2: one flat buffer per bucket; grads[i] is a view into it.
        self.flat: list[np.ndarray] = []
        self.grads: list = [None] * len(arrays)
        self._bucket_of = [0] * len(arrays)
        for k, members in enumerate(self.buckets):
            counts = [int(np.prod(arrays[i].shape)) for i in members]
            flat = np.zeros(sum(counts), self.dtype)
            self.flat.append(flat)
            offset = 0
            for i, n in zip(members, counts):
                self.grads[i] = flat[offset:offset + n].reshape(arrays[i].shape)
                self._bucket_of[i] = k
                offset += n
        self.feedback = [compression.ErrorFeedback(f.size) if error_feedback else None
                         for f in self.flat]
        self._requests: list = [None] * len(self.buckets)   # made at the first launch
        self._ready = np.zeros(len(arrays), bool)
        self._missing = [len(m) for m in self.buckets]
        self._launched = 0

    def __repr__(self) -> str:
        sizes = ", ".join(f"{f.nbytes}" for f in self.flat)
        return f"<Buckets: {len(self.grads)} arrays in {len(self.flat)} buckets of [{sizes}] bytes>"

    def ready(self, i: int) -> None:
        """Array ``i``'s gradient is in ``grads[i]``; start every bucket that is now complete
        (in bucket order)."""
        if isinstance(i, bool) or not isinstance(i, (int, np.integer)) or not 0 <= i < len(self.grads):
            raise ValueError(f"array index {i!r} out of range 0..{len(self.grads) - 1}")
        if self._ready[i]:
            raise ValueError(f"array {i} was already marked ready this step")
        self._ready[i] = True
        self._missing[self._bucket_of[i]] -= 1
        while self._launched < len(self.buckets) and self._missing[self._launched] == 0:
            self._launch(self._launched)
            self._launched += 1

    def wait(self) -> None:
        """Finish every bucket's all-reduce (averaged if asked); then the next step may begin."""
        if not self._ready.all():
            raise ValueError(f"arrays {np.flatnonzero(~self._ready).tolist()} were not marked "
                             "ready() this step")
        try:
            for req in self._requests:
                if req is not None:
                    req.wait()
        finally:
            self._ready[:] = False
            self._missing = [len(m) for m in self.buckets]
            self._launched = 0

    def _launch(self, k: int) -> None:
        flat, codec = self.flat[k], self.codec
        timeout, on_timeout, validate = self._options
        with Call("allreduce", self.algorithm, self.comm, timeout, on_timeout, validate) as call:
            comm = call.comm
            size = comm.Get_size()
            req = self._requests[k]
            if req is None:
                req = self._requests[k] = self._request(call, k)
            call.agree(req.algorithm, op=self.op, dtype=flat.dtype, count=flat.size,
                       compress=self.compress)
            if size == 1 or flat.size == 0:
                return
            if self.feedback[k] is not None:
                self.feedback[k].apply(codec, flat, req._cuts)
            req.start(call, call.open().traffic)

    def _request(self, call, k: int) -> Request:
        """Bucket k's persistent request: its schedule, scratch and wire buffers, once."""
        flat, comm = self.flat[k], call.comm
        size = comm.Get_size()
        if self.algorithm == "auto":
            name = select.allreduce(flat.nbytes, size, flat.size,
                                    call.open().ranks_per_node if size > 1 else None)
            algo = lookup("allreduce", name)
            if not algo.scheduled:          # Buckets run schedules (compression, persistence)
                algo = lookup("allreduce", "ring")
        else:
            algo = lookup("allreduce", self.algorithm)
            if not algo.scheduled:
                raise ValueError(f"Buckets run mpicoll's schedules; algorithm={algo.name!r} has "
                                 "none")
        on_done = None
        if self.average and size > 1:
            def on_done(flat=flat, size=size):
                np.divide(flat, flat.dtype.type(size), out=flat)
        if size == 1 or flat.size == 0:
            req = Request(f"bucket {k}")
        else:
            req = _request(call, algo, flat, self.op, _options(call, algo, {}), codec=self.codec,
                           on_done=on_done, what=f"allreduce {algo.name} (bucket {k})")
        req.algorithm = algo.name
        return req
