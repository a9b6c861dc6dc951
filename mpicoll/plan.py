"""One collective call, one path: the plan every form of every collective runs.

    with Call(collective, algorithm, comm, timeout, on_timeout, validate) as call:
        layout = buffers.allreduce(sendbuf, recvbuf)        # the buffers, checked
        p = plan.make(call, "allreduce", algorithm, layout, op=op, given=options)
        plan.run(call, p, layout)       # blocking; plan.start: a Request; persistent.bind

``make`` turns (collective, buffers, op, root, algorithm, options, communicator) into a frozen
``Plan``: this rank's checks of the op, the dtype, the options and the settings; ``auto``'s
choice and every option the decision table sets (``select.decide``, the one place that
decides); the options resolved; the executor; and the fields every rank must agree on (the
call's signature: op, dtype, count, root, options, node layout, compression, error feedback,
``average``, the group of calls it is one of, the executor and the compiled executor's segment
rule). Every argument that changes what a rank sends or computes is a field of the signature,
so ranks that differ in one never match each other's messages: they raise ``ArgumentMismatch``
(``_runtime.tags``, ``_runtime.watch``) instead of returning different results, at no cost of
a message. The verbs then run it, each in the same order: what can still fail on this rank
(the schedule, the kernel, the scratch: ``prepare``), then the agreement step (``Call.agree``),
then only communication and copies that cannot fail. So a rank never raises after the others
have passed the agreement step and wait for its messages.

* ``run`` -- blocking: the schedule in the executor, the MPI library's own collective, or the
  shared-memory runner; its decisions kept for a call with the same arguments (``cache``).
* ``start`` -- nonblocking: a ``progress.Request`` the progress engine drives (a schedule step
  by step; the MPI library's own nonblocking collective; the shared-memory runner as one
  deferred piece of work).
* ``persistent.bind`` -- persistent: a ``Persistent`` handle over the same pieces, built once
  (``bound``: a schedule bound to its buffers).

The plan's executor is part of the signature: a blocking call runs the compiled executor (or the
Python one: ``MPICOLL_EXECUTOR``), a request the progress engine's step loop, so two ranks that
run different executors (a failed compiled set-up on one node) or split messages by different
segment rules (``MPICOLL_SEGMENT_BYTES``) raise ``ArgumentMismatch`` naming it, never a bare MPI
error.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np
from mpi4py import MPI

from . import cache, compression, kernels, model, ops, select, settings, shm
from ._runtime import loading
from .executors import background
from ._runtime.call import Call
from .buffers import Layout
from .executors import compiled, segments
from .executors import progress
from .executors.progress import Request
from .executors.shared import SharedMemory
from .registry import Algorithm, lookup

__all__ = ["Plan", "make", "begin", "last", "prepare", "run", "start", "launch", "request",
           "bound", "executor", "check_average",
           "library_args", "shared_buffers", "shm_signature", "cuts", "schedule_of",
           "internode_elements", "prepared_schedule", "schedule_fields",
           "LIBRARY"]

# The MPI library's own collective of each kind: blocking, nonblocking, persistent.
LIBRARY = {
    "allreduce": (MPI.Comm.Allreduce, MPI.Comm.Iallreduce, MPI.Comm.Allreduce_init),
    "reduce_scatter_block": (MPI.Comm.Reduce_scatter_block, MPI.Comm.Ireduce_scatter_block,
                             MPI.Comm.Reduce_scatter_block_init),
    "allgather": (MPI.Comm.Allgather, MPI.Comm.Iallgather, MPI.Comm.Allgather_init),
    "bcast": (MPI.Comm.Bcast, MPI.Comm.Ibcast, MPI.Comm.Bcast_init),
}
_AUTO_SETTINGS = ("MPICOLL_TUNING", "MPICOLL_PROFILE", "MPICOLL_SHORT_MSG")


@dataclass(frozen=True, eq=False)
class Plan:
    """What one call runs, decided once (see the module's doc)."""

    collective: str
    algorithm: Algorithm
    options: dict           # resolved, the cost model's picks and bcast's root included
    op: str | None          # None: nothing is reduced (allgather, bcast)
    dtype: np.dtype
    count: int              # the elements the work buffer holds
    block: int              # the count every rank agrees on (one rank's block, or count)
    executor: str           # "mpi" (the library's), "shm", "compiled", "python", "progress"
    segments: str           # the compiled executor's segment rule ("": none)
    codec: object           # compression.Codec or None
    nodes: tuple | None     # the node layout of a node-aware algorithm
    size: int               # the communicator's
    reproducible: int = 0   # K of a reproducible sum's phases (mpicoll.reproducible), 0: none
    in_place: bool | None = None    # auto's all-reduce: sendbuf was MPI.IN_PLACE (select's shm
    #                                 row asks), which every rank must then pass alike
    average: bool = False   # the sum divided by the rank count when it completes
    feedback: bool = False  # error feedback adds the last call's residual to the input first
    group: str | None = None    # the group of calls this one is one of, which every rank makes
    #                             alike (Buckets: "bucket/buckets:crc32 of their dtypes and counts")

    @property
    def kind(self) -> str:
        """``library``, ``shared`` (a shared-memory window), ``schedule``, or ``none``
        (nothing to communicate: one rank, or no elements)."""
        if self.algorithm.library:
            return "library"
        if self.size == 1 or self.count == 0 or self.block == 0:
            return "none"
        if self.executor == "shm" or self.options.get("inner") == "shm":
            return "shared"
        return "schedule"

    def fields(self) -> dict:
        """What every rank must pass alike (``Call.agree``; ``validate.fingerprint``)."""
        get = self.options.get
        return {"op": self.op, "dtype": self.dtype, "count": self.block,
                "root": get("root"), "inner": get("inner"), "outer": get("outer"),
                "order": get("order"), "nodes": self.nodes,
                "compress": None if self.codec is None else self.codec.name,
                "executor": self.executor, "segments": self.segments or None,
                "reproducible": self.reproducible or None, "in_place": self.in_place,
                "average": self.average or None, "feedback": self.feedback or None,
                "group": self.group}

    def agree(self, call: Call, **instead) -> None:
        """Agree this plan's fields across the ranks (``instead``: values that replace some,
        e.g. the user's dtype and count where the plan runs on a derived buffer)."""
        call.agree(self.algorithm.name, **({**self.fields(), **instead} if instead else
                                           self.fields()))

    def describe(self) -> str:
        """The algorithm and its options, as the bench prints them (``ring order=node``)."""
        shown = " ".join(f"{k}={v}" for k, v in self.options.items()
                         if k in ("inner", "outer", "order") and v is not None)
        if self.reproducible:
            shown = f"{shown} reproducible={self.reproducible}".strip()
        return f"{self.algorithm.name} {shown}".strip()


# ----------------------------------------------------------------------------- making a plan

def _local_checks(algo: Algorithm | None, op: str | None, given: dict) -> None:
    """Read (parse and check) the settings this call will need, and check the algorithm's
    options given or set in the environment, all before any communication: a bad value raises
    here, naming it, on every rank that has it."""
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


def make(call: Call, collective: str, algorithm, layout: Layout, *, op=None, root=None,
         given: dict | None = None, compress=None, form: str = "blocking",
         reproducible: int = 0, average: bool = False, feedback: bool = False,
         group: str | None = None) -> Plan:
    """The plan of one call (this rank's checks raise here, before any communication);
    ``form``: ``blocking`` or ``persistent`` (the compiled or Python executor), ``nonblocking``
    (the progress engine). ``reproducible``: K, a phase of a reproducible sum
    (``mpicoll.reproducible.Job``: recorded, agreed, and run by one of mpicoll's schedules).
    ``average``: divide the sum by the rank count; ``feedback``: the call adds error feedback's
    residual (``start``); ``group``: see ``Plan.group`` -- all three enter the signature."""
    checked = _check(collective, algorithm, layout, op, given, compress, average)
    return _decide(call, checked, layout, root, form, reproducible, feedback, group)


def begin(call: Call, collective: str, algorithm, layout: Layout, *, op=None, root=None,
          given: dict | None = None, compress=None, error_feedback=None,
          average: bool = False) -> Request:
    """A nonblocking call: ``make`` then ``start``, returning the started request. Never
    waits for other ranks: on a communicator mpicoll has not set up yet (its first call) this
    rank's checks raise here and the rest goes to the communicator's background thread
    (``executors.background``); the request returned follows it."""
    checked = _check(collective, algorithm, layout, op, given, compress, average)

    def go() -> Request:
        return start(call, _decide(call, checked, layout, root, "nonblocking",
                                   feedback=error_feedback is not None), layout, error_feedback)
    if background.ready_now(call):
        return go()
    return background.later(call, go, f"{collective} {algorithm}", layout.result)


def _check(collective: str, algorithm, layout: Layout, op, given, compress,
           average: bool = False) -> tuple:
    """This rank's own checks of one call: no communication, nothing that needs the
    communicator set up."""
    declared = given or {}                  # the keywords of the form, None: not given
    given = {k: v for k, v in declared.items() if v is not None}
    opname = None if op is None else ops.name(op)
    algo = None if algorithm == "auto" else lookup(collective, algorithm)
    dtype = layout.work.dtype
    ops.check(collective, opname, dtype, algo)
    if average:
        check_average(opname, dtype)
    codec = compression.codec(compress)
    if codec is not None:
        if dtype != np.float32 or opname != "sum":
            raise ValueError(f"compress={compress!r} needs float32 data and op='sum', got "
                             f"{dtype} and op={opname!r}")
        if algo is not None and not algo.scheduled:
            raise ValueError(f"compress={compress!r} needs one of mpicoll's schedules, not "
                             + (f"the MPI library's own {algo.name!r}" if algo.library else
                                f"{algo.name!r} (it has none)"))
        if given.get("inner") == "shm":
            raise ValueError(f"compress={compress!r} needs a schedule: hierarchical "
                             f"inner='shm' has none")
    if algo is None and given:
        raise ValueError(f"{'/'.join(given)} apply only to an algorithm that declares them, "
                         "not to 'auto'")
    _local_checks(algo, opname, given)
    return collective, algo, opname, dtype, codec, given, declared, bool(average)


def check_average(op: str | None, dtype) -> None:
    """``average=True``'s rule: a sum of a floating-point or complex dtype."""
    if dtype.kind not in "fc" and dtype != kernels.bfloat16:
        raise TypeError(f"average=True divides by the number of ranks: it needs "
                        f"floating-point values, got {dtype}; pass average=False")
    if op != "sum":
        raise ValueError(f"average=True needs op='sum', got op={op!r}")


def _decide(call: Call, checked: tuple, layout: Layout, root, form: str,
            reproducible: int = 0, feedback: bool = False, group: str | None = None) -> Plan:
    """The rest of ``make``: ``auto``'s choice and the options (they need the communicator's
    node layout: the first call on it sets it up), the executor, the checks of the node."""
    collective, algo, opname, dtype, codec, given, declared, average = checked
    size = call.size
    st = call.open()
    # auto's all-reduce decides by it (the shm row), so every rank must pass IN_PLACE alike
    in_place = layout.send is None if algo is None and collective == "allreduce" else None
    algo, extra = select.decide(collective, "auto" if algo is None else algo.name,
                                nbytes=layout.work.nbytes, count=layout.work.size, size=size,
                                dtype=dtype, op=opname, st=st, given=given,
                                scheduled=codec is not None or bool(reproducible),
                                in_place=bool(in_place))
    nodes = st.nodes() if algo.has("node-layout") else None
    options = dict(_resolved(algo, tuple({**declared, **extra}.items()), nodes))
    if algo.pick is not None and size > 1:
        options.update(_picked(algo, size, layout.work.size, nodes))
    if root is not None:
        options["root"] = root
    run_by = executor(algo, options, form)
    if algo.has("shared-memory") and size > 1:
        shm.check(st, opname, dtype)
    if options.get("inner") == "shm" and size > 1:
        shm.check_node_phases(st, opname, dtype)
    rule = _segment_rule() if run_by == "compiled" else ""
    st.last_plan = p = Plan(collective, algo, options, opname, dtype, layout.work.size,
                            layout.block, run_by, rule, codec, nodes, size, reproducible,
                            in_place if size > 1 else None, average, feedback, group)
    return p


def last(comm) -> Plan | None:
    """The plan of the last call on ``comm`` that made one (the bench records what ``auto``
    ran from it; a call its cache served made none)."""
    from ._runtime.context import attach
    return getattr(attach(comm), "last_plan", None)


def _segment_rule() -> str:
    """The compiled executor's segment rule as a word (``segments.rule``): a fixed size, or the
    cost model's parameters its optimum comes from."""
    r = segments.rule()
    if r.fixed is not None:
        return f"{r.fixed}B"
    return f"model:{r.alpha:.6g}/{r.beta:.6g}/{r.gamma:.6g}"


def executor(algo: Algorithm, options: dict, form: str) -> str:
    """Who runs a plan: the MPI library, the shared-memory window, or -- for a schedule (and
    hierarchical's inter-node phase in shared memory) -- the progress engine (nonblocking) or
    ``MPICOLL_EXECUTOR``'s executor (``compiled.choose``)."""
    if algo.library:
        return "mpi"
    if algo.has("shared-memory"):
        return "shm"
    if form == "nonblocking" and options.get("inner") != "shm":
        return "progress"
    return "compiled" if _choose() is compiled.execute else "python"


@functools.lru_cache(maxsize=256)
def _picked(algo: Algorithm, size: int, count: int, nodes) -> dict:
    """What the cost model chooses for ``algo`` (``Algorithm.pick``), from the profile ``auto``
    uses, on the link between nodes when there are several."""
    profile = model.default_profile()
    alpha, beta = profile.link(nodes is not None and len(nodes) > 1)
    return algo.pick(size, count, nodes, alpha, beta, profile.gamma)


@functools.lru_cache(maxsize=256)
def _resolved(algo: Algorithm, given: tuple, nodes) -> tuple:
    """``algo.resolve``, cached: the environment is read once (``settings.reload`` clears it)."""
    return tuple(algo.resolve(dict(given), nodes).items())


settings.on_reload(_resolved.cache_clear)
settings.on_reload(_picked.cache_clear)

_execute = None         # the executor (MPICOLL_EXECUTOR), chosen at the first call


def _choose():
    global _execute
    if _execute is None:
        _execute = compiled.choose()
    return _execute


@settings.on_reload
def _forget_executor() -> None:
    global _execute
    _execute = None


# ----------------------------------------------------------------------------- preparing it

@functools.lru_cache(maxsize=256)
def schedule_of(algo: Algorithm, rank: int, size: int, count: int, options: tuple,
                nodes: tuple):
    """The schedule, and how many elements it sends to ranks on other nodes (for the traffic
    counters: counted once per schedule, not per message)."""
    kwargs = dict(options, **({"nodes": nodes} if algo.has("node-layout") else {}))
    sched = algo.schedule(rank, size, count, **kwargs)
    return sched, internode_elements(sched, rank, nodes)


def internode_elements(sched, rank: int, nodes: tuple) -> int:
    """How many elements ``rank``'s schedule sends to ranks on other nodes."""
    node_of = {r: j for j, members in enumerate(nodes) for r in members}
    return sum(hi - lo for _, sends in sched.plan for peer, lo, hi in sends
               if node_of[peer] != node_of[rank])


def _schedule(call: Call, p: Plan):
    st = call.open()
    return schedule_of(p.algorithm, call.rank, p.size, p.count,
                       tuple(p.options.items()), st.nodes())


def _warmup(call: Call, op: str, dtype) -> None:
    """Compile (or load) ``op``'s kernel for ``dtype`` (``kernels.warmup``), before the
    agreement step, under the call's deadline (``_runtime.loading``)."""
    loading.load(lambda: kernels.warmup(op, dtype), call.watch)


def prepare(call: Call, p: Plan):
    """What running ``p`` in a blocking or persistent form needs, made before the agreement
    step: a ``SharedMemory`` runner, or ``(execute, schedule, inter-node elements, op,
    scratch)``; None for the MPI library's collective or nothing to run."""
    kind = p.kind
    if kind == "shared":
        st = call.open()
        if p.executor == "shm":
            return SharedMemory(st, p.dtype, p.op)
        return SharedMemory(st, p.dtype, p.op, _choose(), p.algorithm, p.options["outer"])
    if kind != "schedule":
        return None
    sched, internode = _schedule(call, p)
    return prepared_schedule(call, sched, internode, p.op, p.dtype)


def schedule_fields() -> dict:
    """The executor's fields of ``Plan.fields`` for a schedule a blocking or persistent call
    runs, which no plan names (``mpicoll.reproducible``'s exchange of values)."""
    run_by = "compiled" if _choose() is compiled.execute else "python"
    return {"executor": run_by,
            "segments": (_segment_rule() if run_by == "compiled" else "") or None}


def prepared_schedule(call: Call, sched, internode: int, op: str | None, dtype):
    """``prepare``'s tuple for a schedule of ``dtype`` elements (``op`` None: nothing is
    reduced), also one no plan names (``mpicoll.reproducible``'s exchange of values)."""
    execute = _choose()
    op = op or kernels.ops_for(dtype)[0]            # nothing is reduced (allgather, bcast)
    if execute is not compiled.execute:             # (the compiled loop compiles its own)
        _warmup(call, op, dtype)
    scratch = call.open().scratch(dtype, compiled.scratch_elements(execute, sched,
                                                                   dtype.itemsize))
    return execute, sched, internode, op, scratch


def shm_signature(call: Call) -> tuple:
    """``shm``'s (signature, mismatch): the hash of the call's arguments, which every rank
    publishes beside its input in the shared window, and what to do when they differ."""
    return (call.signature.hashed if call.signature is not None else 0, lambda: call.disagree(
        "the argument check of the shared-memory all-reduce (the ranks' hashes differ)"))


def library_args(p: Plan, layout: Layout) -> tuple:
    """The arguments of the MPI library's own collective (bfloat16 as uint16 where it only
    copies: ``kernels.as_storage``)."""
    if p.collective == "bcast":
        return (kernels.as_storage(layout.recv),), {"root": p.options["root"]}
    send = MPI.IN_PLACE if layout.send is None else layout.send
    if p.collective == "allgather":
        return (send if layout.send is None else kernels.as_storage(send),
                kernels.as_storage(layout.recv)), {}
    return (send, layout.recv), {"op": ops.MPI_OPS[p.op]}


def shared_buffers(layout: Layout) -> tuple:
    """The shared-memory runner's (src, dst): it reads sendbuf itself (recvbuf in place)."""
    return (layout.recv if layout.send is None else layout.send).reshape(-1), \
        layout.recv.reshape(-1)


# ----------------------------------------------------------------------------- the verbs

def reads_input(prepared, layout: Layout) -> bool:
    """Whether the schedule of ``prepare``'s tuple runs on ``layout`` reading the input itself
    where no step wrote yet (``Layout.source``; the compiled executor), not a copy of it."""
    return layout.source is not None and prepared[0] is compiled.execute


def run(call: Call, p: Plan, layout: Layout, key=None):
    """Run ``p`` on ``layout`` now (blocking); returns the result. ``key``: the cache key of
    the call's decisions (``cache``), or None."""
    prepared = prepare(call, p)
    p.agree(call)
    kind = p.kind
    if kind == "library":
        args, kwargs = library_args(p, layout)
        blocking, nonblocking, _ = LIBRARY[p.collective]
        call.mpi(blocking, nonblocking, *args, **kwargs)
        cache.remember(call, key, p, None)
        return _average(p, layout)
    progress.finish_deferred(call.open())   # (they share its scratch and window)
    if kind == "shared":
        prepared.run(*shared_buffers(layout), call.tag, call.watch, *shm_signature(call))
    elif prepared is not None:
        execute, sched, internode, op, scratch = prepared
        st = call.open()
        if reads_input(prepared, layout):       # the loop reads the input: no copy in
            reads = {"src": layout.source, "kept": layout.kept}
        else:
            layout.copy_in()
            reads = {}
        execute(sched, layout.work, st.comm, op=op, tag=call.tag, scratch=scratch,
                traffic=st.traffic, watch=call.watch, **reads)
        st.traffic["internode_bytes"] += internode * p.dtype.itemsize
        layout.copy_out()
    else:
        layout.copy_in()
        layout.copy_out()
    cache.remember(call, key, p, prepared)
    return _average(p, layout)


def _average(p: Plan, layout: Layout) -> np.ndarray:
    """The result, divided by the rank count where ``p.average`` (the sum's own dtype: the
    same bits on every rank)."""
    result = layout.result
    if p.average and p.size > 1:
        np.divide(result, result.dtype.type(p.size), out=result)
    return result


def request(call: Call, p: Plan, layout: Layout, *, on_done=None) -> Request:
    """``p`` on ``layout`` as a request, not started (made before the agreement step); its
    ``on_done`` runs, then the division of ``p.average``."""
    what = f"{p.collective} {p.algorithm.name}"
    if p.average and p.size > 1:
        on_done = _then_average(on_done, p, layout)
    kind = p.kind
    if kind == "library":
        args, kwargs = library_args(p, layout)
        nonblocking = LIBRARY[p.collective][1]
        return Request(what, result=layout.result, on_done=on_done,
                       library=lambda comm: nonblocking(comm, *args, **kwargs))
    if kind == "none":
        return Request(what, result=layout.result, on_done=on_done)
    if kind == "shared":         # (on the tag and signature of the call that starts it)
        runner, (src, dst) = prepare(call, p), shared_buffers(layout)
        req = Request(what, result=layout.result, on_done=on_done,
                      deferred=lambda watch: runner.run(src, dst, req.call.tag, watch,
                                                        *shm_signature(req.call)))
        return req
    sched, internode = _schedule(call, p)
    op = p.op or kernels.ops_for(p.dtype)[0]
    _warmup(call, op, p.dtype)
    if p.codec is not None:
        compression.warmup()
    return Request(what, sched, kernels.as_storage(layout.work),
                   reduce_into=kernels.kernel(op, p.dtype), codec=p.codec,
                   cuts=cuts(call, p), on_done=on_done, result=layout.result,
                   internode_bytes=internode * p.dtype.itemsize)


def _then_average(on_done, p: Plan, layout: Layout):
    def done():
        if on_done is not None:
            on_done()
        _average(p, layout)
    return done


def start(call: Call, p: Plan, layout: Layout, error_feedback=None) -> Request:
    """Start ``p`` on ``layout`` (nonblocking); returns the started request."""
    after = layout.copy_out if layout.after and p.kind != "library" else None
    return launch(call, p, request(call, p, layout, on_done=after), layout, error_feedback)


def launch(call: Call, p, req: Request, layout: Layout, error_feedback=None,
           **instead) -> Request:
    """Start ``req`` (``request``'s for ``p``, or a ``Job``'s: started again each step by
    ``Buckets``): the agreement step (``instead``: as ``Plan.agree``'s), the input copied in,
    error feedback's residual added where the plan runs a schedule (compression needs one:
    ``_check``), then the start."""
    p.agree(call, **instead)
    if p.kind != "library":
        layout.copy_in()
        if error_feedback is not None and p.kind == "schedule":
            error_feedback.apply(p.codec, layout.work, req.cuts)
    return req.start(call, call.open().traffic)


def cuts(call: Call, p: Plan):
    """int8's pieces for ``p`` (``compression.schedule_cuts``): cut at every slice edge of every
    rank's schedule."""
    if p.codec is None or p.codec.name != "int8":
        return None
    return _cached_cuts(p.algorithm, p.size, p.count, tuple(p.options.items()),
                        call.open().nodes())


@functools.lru_cache(maxsize=64)
def _cached_cuts(algo: Algorithm, size: int, count: int, options: tuple, nodes):
    return compression.schedule_cuts(
        count, [schedule_of(algo, r, size, count, options, nodes)[0] for r in range(size)])


def bound(call: Call, p: Plan | None, prepared, flat: np.ndarray, src=None, kept=None):
    """``run(watch, tag=None)``: the schedule on ``flat``, bound once to everything it uses,
    with its own scratch (a persistent handle may run in the progress thread beside a blocking
    call); on ``call``'s tag, or ``tag`` (a later call's: ``Buckets``' reproducible sums).
    ``prepared``: ``prepare(call, p)``'s, or ``prepared_schedule``'s (p None). ``src``,
    ``kept``: the input, which the compiled executor reads where no step wrote yet instead of
    a copy in ``flat`` (``reads_input``), and the part of ``flat`` the call keeps."""
    execute, sched, internode, op, _ = prepared
    st = call.open()
    scratch = np.empty(compiled.scratch_elements(execute, sched, flat.itemsize), flat.dtype)
    traffic, internode_bytes = st.traffic, internode * flat.itemsize
    if execute is compiled.execute:
        bound = compiled.Bound(sched, flat, st.comm, op=op, tag=call.tag, scratch=scratch,
                               traffic=traffic, src=src, kept=kept).run

        def run_compiled(watch, tag=None):
            bound(watch, tag)
            traffic["internode_bytes"] += internode_bytes
        return run_compiled

    def run_python(watch, tag=None):
        execute(sched, flat, st.comm, op=op, tag=call.tag if tag is None else tag,
                scratch=scratch, traffic=traffic, watch=watch)
        traffic["internode_bytes"] += internode_bytes
    return run_python
