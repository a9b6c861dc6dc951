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
have passed the agreement step and wait for its messages. What runs is one prepared call
(``Prepared``, ``mpicoll.prepared``), whatever the form:

* ``run`` -- blocking: the schedule in the executor, the MPI library's own collective, or the
  shared-memory runner; the prepared call kept for a call with the same arguments (``cache``).
* ``start`` -- nonblocking: a ``progress.Request`` the progress engine drives (a schedule step
  by step; the MPI library's own nonblocking collective; the shared-memory runner as one
  deferred piece of work), held by the prepared call (``Prepared.hold``, ``Prepared.start``;
  ``Buckets`` hold one per bucket and start it again each step).
* ``persistent.bind`` -- persistent: a ``Persistent`` handle over the prepared call bound once
  to its buffers (``Prepared.bind``), run by ``Prepared.run_bound`` or ``start`` / ``wait``.

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

from . import cache, compression, kernels, model, ops, select, settings, shm
from .executors import background
from ._runtime.call import Call
from .buffers import Layout
from .executors import segments
from .executors.progress import Request
from .prepared import (LIBRARY, Prepared, Scheduled, _average, _choose, cuts, failure,
                       internode_elements, library_args, prepare, prepared_schedule,
                       schedule_of, shared_buffers, shm_signature)
from .registry import Algorithm, lookup

__all__ = ["Plan", "Prepared", "Scheduled", "make", "begin", "last", "prepare", "run", "start",
           "failure", "executor", "check_average",
           "library_args", "shared_buffers", "shm_signature", "cuts", "schedule_of",
           "internode_elements", "prepared_schedule", "schedule_fields",
           "LIBRARY"]

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
    p = Plan(collective, algo, options, opname, dtype, layout.work.size, layout.block, run_by,
             rule, codec, nodes, size, reproducible, in_place if size > 1 else None, average,
             feedback, group)
    st.remember_plan(p)
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
    return _choose().name


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


def schedule_fields() -> dict:
    """The executor's fields of ``Plan.fields`` for a schedule a blocking or persistent call
    runs, which no plan names (``mpicoll.reproducible``'s exchange of values)."""
    run_by = _choose().name
    return {"executor": run_by,
            "segments": (_segment_rule() if run_by == "compiled" else "") or None}


# ----------------------------------------------------------------------------- the verbs

def run(call: Call, p: Plan, layout: Layout, key=None):
    """Run ``p`` on ``layout`` now (blocking); returns the result. ``key``: the cache key of
    the call's decisions (``cache``), or None."""
    prepared = prepare(call, p)
    p.agree(call)
    prepared.run(call, layout)
    cache.remember(call, key, prepared)
    return _average(p, layout)


def start(call: Call, p: Plan, layout: Layout, error_feedback=None) -> Request:
    """Start ``p`` on ``layout`` (nonblocking); returns the started request: the prepared
    call's, held (``Prepared.hold``), started (``Prepared.start``: the agreement step, the input
    copied in, error feedback's residual added, the start)."""
    return prepare(call, p).hold(call, layout).start(call, error_feedback)
