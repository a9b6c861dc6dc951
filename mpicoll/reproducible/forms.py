"""The reproducible dispatch: every form that takes ``reproducible=`` -- the blocking and
nonblocking calls (``mpicoll.api``), the persistent ``*_init`` (``mpicoll.persistent``) and
``Buckets`` -- hands it to ``dispatch``, here. This module is light (``mpicoll.api`` imports
it); the kernels (numba, ml_dtypes: seconds of a process's first call) load on the first
reproducible call."""

from __future__ import annotations

from .._runtime.call import Call
from ..executors import progress
from ..registry import lookup

FORMS = ("blocking", "nonblocking", "persistent", "Buckets")


def spelled(reproducible):
    """``reproducible=True`` (None: the default K) or an int K, checked (TypeError)."""
    if reproducible is True:
        return None
    if type(reproducible) is not int:
        raise TypeError(f"reproducible must be True, False or an int K (slices per value), "
                        f"got {reproducible!r}")
    return reproducible


def runs_as_job(collective: str, algorithm, inner=None) -> bool:
    """Whether the blocking call runs a ``Job`` (a schedule or ``auto``; not the MPI library's
    or a shared-memory collective, which ``collective.allreduce`` / ``reduce_scatter_block``
    run as nested calls)."""
    if inner == "shm" or not isinstance(algorithm, str):
        return False
    if algorithm == "auto":
        return True
    try:
        algo = lookup(collective, algorithm)
    except ValueError:
        return False                    # the plain path names the bad algorithm
    return not (algo.library or algo.has("shared-memory"))


def dispatch(form: str, collective: str, reproducible, sendbuf, recvbuf, *, op,
             algorithm="auto", given=None, comm=None, timeout=None, on_timeout=None,
             validate=None, compress=None, error_feedback=None, call=None, handle=None):
    """``collective`` (``allreduce`` or ``reduce_scatter_block``) with ``reproducible=True``
    or K, in ``form`` (one of ``FORMS``); the other arguments are the form's. Returns what the
    form returns:

    - ``blocking``: recvbuf. A ``Job`` run now, in its own call, where the algorithm is one of
      mpicoll's schedules or ``auto``; with ``mpi`` or ``shm`` (or ``inner="shm"``), the nested
      calls (``collective.allreduce`` / ``reduce_scatter_block``).
    - ``nonblocking``: a started ``Request`` running a ``Job`` whole in the progress engine
      (``wait()`` returns recvbuf).
    - ``persistent``: ``handle(call, job)`` (the form's handle), made in the ``Job``'s call.
    - ``Buckets``: the ``Job`` one bucket runs, made in the form's ``call``.
    """
    k = spelled(reproducible)
    # the kernels' modules: numba and ml_dtypes, loaded on the first reproducible call only
    from . import collective as nested, job
    given = given or {}
    if form == "blocking" and not runs_as_job(collective, algorithm, given.get("inner")):
        options = {**given, "compress": compress, "error_feedback": error_feedback} \
            if collective == "allreduce" else {}
        return getattr(nested, collective)(sendbuf, recvbuf, op=op, algorithm=algorithm,
                                           comm=comm, k=k, timeout=timeout,
                                           on_timeout=on_timeout, validate=validate, **options)
    pool = job.SPARE if form in ("blocking", "nonblocking") else None
    if call is not None:
        return job.Job(call, collective, sendbuf, recvbuf, op=op, k=k, algorithm=algorithm,
                       given=given, form=form, compress=compress,
                       error_feedback=error_feedback, pool=pool)
    with Call(collective, algorithm, comm, timeout, on_timeout, validate) as call:
        run = job.Job(call, collective, sendbuf, recvbuf, op=op, k=k, algorithm=algorithm,
                      given=given, form=form, compress=compress,
                      error_feedback=error_feedback, pool=pool)
        if form == "persistent":
            return handle(call, run)
        if form == "nonblocking":
            req = progress.Request(f"{collective} {run.plan.describe()}", result=run.result,
                          deferred=run.run, on_done=lambda: run.release(pool))
            return req.start(call, call.open().traffic)
        if run.window:                  # (the window is the requests' in flight first)
            progress.finish_deferred(call.open())
        try:
            run.run(call.watch)
        finally:
            run.release(pool)
        return run.result
