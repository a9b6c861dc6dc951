"""A reproducible SUM as plans (``Job``): what every form runs -- the blocking call with one of
mpicoll's schedules or ``auto``, the nonblocking and persistent forms and ``Buckets`` -- made
and started by ``forms.dispatch``."""

from __future__ import annotations

import functools

import numpy as np

from .. import plan, shm
from ..algorithms import alltoall_pairwise
from ..buffers import Layout
from ..registry import lookup
from ..shm import transport
from ..shm import window as shm_window
from . import collective
from .binned import _FLOAT_KERNELS, BinnedSum, _check_terms, _format, _in_pairs, rounded, \
    rounded_pair, rounded_rows
from .collective import _input, _large, _local_slices, _options, _terms
from .slice_kernels import _codes_into


class Job(plan.Prepared):
    """One reproducible SUM bound to its buffers, for the forms that run it later: nonblocking
    (``iallreduce``, ``ireduce_scatter_block``), persistent (``*_init``) and ``Buckets``.

    Made inside the form's ``Call``: this rank's checks first (op SUM, a float dtype, K in
    ``K_RANGE``, no compression; a schedule, not the MPI library's or the shared-memory
    collective: ``NotImplementedError`` naming the form), then two plans (``mpicoll.plan``,
    ``reproducible=K``, one of mpicoll's schedules): the MAX of the bin codes (an all-reduce,
    int8) and the SUM of the slices (the call's own collective, int64: ``plan``), then one
    agreement of the call's signature -- the caller's dtype and count, the SUM's algorithm,
    options and executor, and K -- so a rank with ``reproducible=`` and one without (or another
    K) raise ``ArgumentMismatch``. Both phases run under the call's tag, one after the other
    (MPI's messages between two ranks on one tag arrive in order). ``run(watch)`` is the whole
    call: codes, MAX, slices, SUM, one rounding into recvbuf -- the same function of the values'
    multiset as the blocking call's, so the same bits. ``auto`` on a large array instead runs
    the exchange path (``_init_exchange``): the values' pairwise exchange, each rank's block
    summed and rounded by ``rounded_rows``, and for the all-reduce an all-gather of the
    floats; for a float32/float64 all-reduce on one node, the window path (``_init_window``)."""

    def __init__(self, call, collective: str, sendbuf, recvbuf, *, op, k, algorithm="auto",
                 given=None, form: str = "nonblocking", compress=None, error_feedback=None,
                 pool: dict | None = None):
        def take(count, dtype):         # every element is written before it is read (run)
            spare = pool.pop((count, np.dtype(dtype)), None) if pool is not None else None
            return spare if spare is not None else np.empty(count, dtype)
        given = {key: v for key, v in (given or {}).items() if v is not None}
        _options(op, compress, error_feedback)
        algo = None if algorithm == "auto" else lookup(collective, algorithm)
        if (algo is not None and (algo.library or algo.has("shared-memory"))) \
                or given.get("inner") == "shm":
            what = f"inner='shm'" if algo is None or not (algo.library or algo.has(
                "shared-memory")) else f"algorithm={algorithm!r}"
            raise NotImplementedError(
                f"reproducible=True in the {form} form of {collective} runs on one of "
                f"mpicoll's schedules, not {what} (the MPI library's or the shared-memory "
                f"collective); pick another algorithm, or the blocking call")
        size, rank = call.comm.Get_size(), call.comm.Get_rank()
        if collective == "allreduce":
            src, recv, k = _input(sendbuf, recvbuf, k, lambda shape, n: shape, False)
            if recv.size != src.size:
                raise ValueError(f"recvbuf has {recv.size} elements, expected {src.size}")
            n = block = src.size
            # auto, large: each rank rounds a block of n/N elements, then the floats are
            # all-gathered. The values of its block come to it from every rank by a pairwise
            # exchange (``exchange``: the plain all-reduce's bytes), or a BinnedSum's slices by
            # a reduce-scatter; small, or an explicit algorithm: one all-reduce of the slices
            split = _large(algorithm, size, src, k)
            exchange = split and not isinstance(src, BinnedSum)
            window = exchange and _on_window(call, src.dtype, src.nbytes)
            blk = -(-n // size) if split else n
            stride = blk * k + 1
            sums = None if exchange else take(size * stride if split else stride, np.int64)
            # the floats are gathered into recvbuf itself where its blocks are whole
            direct = split and size * blk == n and recv.flags.c_contiguous
            self.floats = None if window or not split else recv.reshape(-1) if direct else \
                take(size * blk, recv.dtype)
            self.blk, self.direct = blk, direct
        else:
            def block_shape(shape, total):
                return shape[1:] if len(shape) > 1 and shape[0] == size else (total // size,)
            src, recv, k = _input(sendbuf, recvbuf, k, block_shape, False)
            if src.size % size:
                raise ValueError(f"sendbuf has {src.size} elements, not a multiple of the "
                                 f"communicator size {size}")
            n = block = src.size // size
            if src is not recv and recv.size != n:
                raise ValueError(f"recvbuf has {recv.size} elements, expected {n}")
            # auto, large, an array: block r's values go to rank r by the pairwise exchange,
            # and each rank sums its block's rows (as the all-reduce's exchange path)
            exchange = _large(algorithm, size, src, k) and not isinstance(src, BinnedSum)
            window = False
            stride = n * k + 1
            sums = None if exchange else take(size * stride, np.int64)
            self.floats, self.direct, self.blk = None, False, n
        self.collective, self.k, self.dtype, self.size, self.rank = collective, k, recv.dtype, \
            size, rank
        self.src, self.recv, self.n, self.stride = src, recv, n, stride
        self.out = recv.reshape(-1)[:n]         # in place: recvbuf's first block
        self.values, self.window = None, False
        self.layout = Layout(recv.reshape(-1), (), (), recv, None, recv, block)
        if window:
            self.codes = self.sums = None
            self._init_window(call)
            return
        if exchange:
            # this rank's values (padded to N blocks), then every rank's values of this rank's
            # block, one row per rank; the codes and slices of rows where not fused
            fused = src.dtype in _FLOAT_KERNELS
            self.values = take(2 * size * self.blk, src.dtype)
            sums = take(0 if fused else self.blk * k, np.int64)
            self.codes = take(0 if fused else size * self.blk, np.int8)
        else:
            self.codes = take(src.size, np.int8)        # the codes of the values (the MAX's)
        self.sums = sums
        if self.values is not None:
            self._init_exchange(call)
            return

        def whole(a):
            return Layout(a, (), (), a, None, a, a.size)
        split = collective == "allreduce" and self.floats is not None
        self.split = split
        sums_layout = whole(sums) if collective == "allreduce" and not split else \
            Layout(sums, (), (), sums, None, sums, stride)
        self.plan = p = plan.make(call, "reduce_scatter_block" if split else collective,
                                  algorithm, sums_layout, op="sum", given=given,
                                  form="persistent", reproducible=k)
        g = None if not split else plan.make(
            call, "allgather", "auto", Layout(self.floats, (), (), self.floats, None,
                                              self.floats, self.blk),
            form="persistent", reproducible=k)
        max_algo = p.algorithm.name if collective == "allreduce" and not split else "auto"
        max_given = given if collective == "allreduce" and not split else {}
        self.max_plan = q = plan.make(call, "allreduce", max_algo, whole(self.codes), op="max",
                                      given=max_given, form="persistent", reproducible=k)
        call.open().remember_plan(p)
        prepared = [plan.prepare(call, x) for x in (p, q, g) if x is not None]
        p.agree(call, dtype=self.dtype, count=block)
        bufs = (sums, self.codes, self.floats)
        self._sum, self._max, *gather = [x.bind(call, whole(a)) for x, a in zip(prepared, bufs)]
        self._gather = gather[0] if gather else None

    def _init_exchange(self, call) -> None:
        """The exchange path's pieces: the pairwise exchange of values (a schedule no plan
        names: ``alltoall_pairwise``) and, for the all-reduce, the all-gather of the rounded
        floats; one agreement, algorithm ``exchange`` (a rank that passed a ``BinnedSum`` runs
        the slices' reduce-scatter instead: the two raise ``ArgumentMismatch``)."""
        size, rank, blk = self.size, self.rank, self.blk
        _check_terms(size)                      # (one value per rank and element)
        g = None
        if self.collective == "allreduce":
            g = plan.make(call, "allgather", "auto", Layout(self.floats, (), (), self.floats,
                                                            None, self.floats, blk),
                          form="persistent", reproducible=self.k)
        sched, internode = _exchange_schedule(rank, size, blk, call.open().nodes())
        exchange = plan.prepared_schedule(call, sched, internode, None, self.values.dtype)
        prepared = plan.prepare(call, g) if g is not None else None
        if g is not None:
            self.plan = g
            call.open().remember_plan(g)
            fields = g.fields()
        else:
            self.plan = _Described(f"exchange reproducible={self.k}")
            fields = {"reproducible": self.k, **plan.schedule_fields()}
        call.agree("exchange", **{**fields, "op": "sum", "dtype": self.dtype, "count": self.n})
        self._exchange = exchange.bind(call, self.values)
        self._gather = None if prepared is None else prepared.bind(
            call, Layout(self.floats, (), (), self.floats, None, self.floats, self.floats.size))

    def _init_window(self, call) -> None:
        """The one-node path (``_on_window``): no schedule, ``shm``'s window; one agreement,
        algorithm ``window`` (its hash also goes beside each rank's values in the window)."""
        shm.warmup(self.dtype)
        _check_terms(self.size)
        self.plan = _Described(f"window reproducible={self.k}", "window", reproducible=self.k,
                               executor="shm", op="sum", dtype=self.dtype, count=self.n)
        call.open().remember_plan(self.plan)
        self.plan.agree(call)
        self._call, self.window = call, True

    def _run_window(self, watch, call=None) -> None:
        """Every rank's values in the window (shm's Phase 1), this rank's slice of each chunk
        summed over the ranks' rows and rounded (``rounded_rows``: the values' function, as
        the exchange's), the slices copied out (Phase 3)."""
        size, k, call = self.size, self.k, call or self._call

        def rows(x, stride, out):
            rounded_rows(x, size, k, out, stride=stride)
        transport.window_allreduce(call.open(), self.src.reshape(-1), self.recv.reshape(-1), "sum",
                                   watch, *plan.shm_signature(call), tag=call.tag, rows=rows)

    def _run_exchange(self, watch, tag=None) -> None:
        """The exchange path (``__init__``): values out by blocks, this rank's block's sum
        rounded (the local ``sum`` of the N rows: the same function of the values); for the
        all-reduce, the floats all-gathered."""
        size, rank, blk, k = self.size, self.rank, self.blk, self.k
        mine, rows = self.values[:size * blk], self.values[size * blk:]
        mine[:self.src.size] = self.src.reshape(-1)
        mine[self.src.size:] = 0                        # (the all-reduce's last block)
        self._exchange(watch, tag)
        own = mine[rank * blk:(rank + 1) * blk]
        out = self.out if self.floats is None else self.floats[rank * blk:(rank + 1) * blk]
        if _in_pairs(size, self.dtype):                   # (the own row read in place)
            rounded_pair(own, rows[(1 - rank) * blk:(2 - rank) * blk], k, out)
        else:
            rows[rank * blk:(rank + 1) * blk] = own
            rounded_rows(rows, size, k, out, codes=self.codes, limbs=self.sums)
        if self._gather is not None:
            self._gather.once(watch, tag)
        if self.floats is not None and not self.direct:
            np.copyto(self.recv.reshape(-1), self.floats[:self.n])

    @property
    def result(self):
        return self.recv

    # a ``plan.Prepared`` bound to its buffers, whose run is the whole call's: held and
    # started by ``persistent.Persistent`` and ``Buckets`` (``start``, ``wait``); it reads and
    # writes recvbuf itself
    copies = feedback = False
    _before = _after = ()

    def _bound(self, watch, tag=None) -> None:
        self.run(watch)

    def release(self, pool: dict) -> None:
        """Give the job's buffers to ``pool`` (a blocking call's or a request's, done): the next
        one of the same size takes them instead of faulting in fresh pages (the slices are
        K x 8/s times the data). Requests in flight together each take their own."""
        if len(pool) > 8:
            pool.clear()
        for a in (self.codes, self.sums, None if self.direct else self.floats, self.values):
            if a is not None:
                pool[(a.size, a.dtype)] = a

    def run(self, watch, call=None) -> None:
        """The whole call (see the class's doc), under ``watch``; ``call``: the one that runs
        it, if not the one it was made in (``Buckets`` start theirs again each step, each time
        in a new call: its tag, and in the window its signature's hash)."""
        tag = None if call is None else call.tag
        if self.window:
            return self._run_window(watch, call)
        if self.values is not None:
            return self._run_exchange(watch, tag)
        src, top, sums, k, n = self.src, self.codes, self.sums, self.k, self.n
        if isinstance(src, BinnedSum):
            top[...] = src.codes
        else:
            mb, eb, view = _format(src.dtype)
            _codes_into(src.reshape(-1).view(view), mb, eb, top)
        self._max.once(watch, tag)
        if self.split:
            stride, blk, rank = self.stride, self.blk, self.rank
            sums[stride - 1::stride] = _terms(src)
            for r in range(n // blk, self.size):        # the last blocks' missing elements
                held = min(max(n - r * blk, 0), blk)
                sums[r * stride:r * stride + k * blk].reshape(k, blk)[:, held:] = 0
            _local_slices(src, top, k, out=sums, block=blk, stride=stride)
            self._sum.once(watch, tag)
            mine = sums[rank * stride:(rank + 1) * stride]
            _check_terms(int(mine[-1]))
            lo, hi = min(rank * blk, n), min((rank + 1) * blk, n)
            rounded(mine, top[lo:hi], k, self.dtype, block=blk,
                    out=self.floats[rank * blk:rank * blk + hi - lo])
            if self._gather is not None:
                self._gather.once(watch, tag)
            if not self.direct:
                np.copyto(self.recv.reshape(-1), self.floats[:n])
            return
        if self.collective == "allreduce":
            _local_slices(src, top, k, out=sums[:n * k])
            sums[-1] = _terms(src)
            self._sum.once(watch, tag)
            _check_terms(int(sums[-1]))
            rounded(sums, top, k, self.dtype, out=self.recv.reshape(-1))
            return
        stride, lo = self.stride, self.rank * self.n
        sums[stride - 1::stride] = _terms(src)
        _local_slices(src, top, k, out=sums, block=n or 1, stride=stride)
        self._sum.once(watch, tag)
        mine = sums[self.rank * stride:(self.rank + 1) * stride]
        _check_terms(int(mine[-1]))
        rounded(mine, top[lo:lo + n], k, self.dtype, out=self.out)


def _on_window(call, dtype, nbytes: int) -> bool:
    """Whether a large all-reduce of ``nbytes`` runs through ``shm``'s window (``WINDOW``):
    float32/float64 (the fused rows), every rank on one node where shm can run, and a window
    (two segments per rank) of at most a quarter of the file system it lives in -- a container's
    64 MB /dev/shm holds no 8 ranks' 4 MiB segments -- the same answer on every rank: the
    layout, the dtype, the setting and that file system's size are."""
    if not (collective.WINDOW and dtype in _FLOAT_KERNELS
            and shm.usable(call.open(), "sum", dtype)):
        return False
    size_class = shm_window.size_class(nbytes)
    return 4 * shm_window.footprint(call.comm.Get_size(), size_class) <= shm_window.room()


@functools.lru_cache(maxsize=64)
def _exchange_schedule(rank: int, size: int, count: int, nodes: tuple) -> tuple:
    """The pairwise exchange's schedule and the elements it sends to other nodes, kept as
    ``plan.schedule_of`` keeps a registered algorithm's (a schedule is immutable, and the
    compiled executor keeps its segmented plan on it: made once, not per call)."""
    sched = alltoall_pairwise.schedule(rank, size, count)
    return sched, plan.internode_elements(sched, rank, nodes)


class _Described:
    """What a ``Job`` runs, where no plan names it, for ``describe()`` (requests, handles)
    and, given the algorithm and fields every rank must agree on, ``agree(call)``
    (``Buckets``, each launch)."""

    def __init__(self, text: str, algorithm: str = "", **fields):
        self.text, self._agreed = text, (algorithm, fields)

    def agree(self, call, **instead) -> None:
        algorithm, fields = self._agreed
        call.agree(algorithm, **{**fields, **instead})

    def describe(self) -> str:
        return self.text


SPARE: dict = {}        # (count, dtype) -> a buffer a finished blocking call's or request's
                        # Job gave back (``Job.release``)
