"""The fault matrix (issue #22): every misuse, for every algorithm and form -- what each rank saw.

    mpiexec -n 3 python -m mpi4py jobs/experiments/fault_matrix.py --markdown docs/reliability.md
    mpiexec -n 2 python -m mpi4py jobs/experiments/fault_matrix.py --quick      # CI (tests/jobs/test_fault_matrix.py)

Each case runs on a fresh ``comm.Dup()``, after one matching call of the same algorithm and
form on it (so later calls take the prepared path where they can), with ``timeout=--timeout``
(default 5 s: an error that comes at the deadline shows as ~5 s, one found while waiting as
tens of milliseconds). Every rank records what it got -- its result (right or wrong) or its
exception -- and when; rank 0 judges the case against what docs/reliability.md promises and
prints one line per case, algorithm and form. Verdicts: ``ok`` (the promise held: every rank
raised a clear error within its bound, or returned the right result where that is the
promise); ``FAIL`` (something else: a rank returned a wrong result, raised another error, or
took longer); ``limit`` (a documented limit, e.g. a skipped call with the same arguments
without ``validate="callsite"``); ``owner`` (a case another issue owns -- shm, ``Buckets`` --
shown as it is today). A case that hangs is caught by a bounded barrier after it: the job
prints ``HANG`` and aborts (exit status 3). Exit status 1 if any ``FAIL``.

Forms: ``blocking`` (``allreduce``), ``nonblocking`` (``iallreduce(...).wait()``),
``persistent`` (``allreduce_init(...)()``); bcast cases use ``bcast``, ``ibcast``,
``bcast_init``.

``--death ALGO`` adds, as the job's last case, a rank's death in a call of ALGO (``shm``: peer
death in the shared window): the last rank exits as shm's copy loop starts (another algorithm:
in its first wait mid-schedule, every rank on the Python executor), and the others must raise
naming it within the deadline + 1 s -- or return the right result where its data was already
out. A dead rank ends the job for what would follow, so it comes last, once per job; the
survivors report over a communicator of their own and end without ``MPI_Finalize``. Launch it
with Hydra's clean-up off, or the launcher kills the survivors first:

    mpiexec -disable-auto-cleanup -n 3 python -m mpi4py jobs/experiments/fault_matrix.py --death shm

``--elastic`` (run it without mpiexec: it launches its own jobs) is issue 42's section instead:
training that survives deaths. Each case launches ``jobs/experiments/train_dp.py`` (every rank
under ``mpicoll survive``, ``-disable-auto-cleanup``) with ranks killed at given steps, and
judges what the survivors wrote: ``ok`` when every survivor ends with the expected rank count
and the uninterrupted run's weights -- bit for bit with ``--reproducible``, within 1e-6
relative without -- and each recovery (death to the first step on the new communicator) took
under ``RECOVERY`` seconds; else ``FAIL``, saying why. ``--markdown FILE`` rewrites the table
between ``<!-- fault-matrix elastic -->`` and ``<!-- /fault-matrix elastic -->``:

    python jobs/experiments/fault_matrix.py --elastic --reps 2 --markdown docs/elastic.md

``--markdown FILE`` rewrites the table between ``<!-- fault-matrix -->`` and
``<!-- /fault-matrix -->`` in FILE (docs/reliability.md's), ``--json FILE`` writes every
record, ``--reps K`` repeats every case K times (the verdict is the worst). (What the checks
cost per call: tests/internals/check_cost.py.)
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np
from mpi4py import MPI

import mpicoll
from mpicoll.errors import ArgumentMismatch, CollectiveTimeout, ConcurrentCall, PeerError
from mpicoll.registry import COLLECTIVES
from mpicoll import testing
from mpicoll.testing import environment, exit_in_next_call

ALGORITHMS = tuple(COLLECTIVES["allreduce"]) + ("auto",)
BCAST = tuple(COLLECTIVES["bcast"]) + ("auto",)
FORMS = ("blocking", "nonblocking", "persistent")
QUICK = ("ring", "recursive_doubling", "naive", "mpi", "auto")
FAST = 2.0                  # seconds: the bound for mismatches and local errors (issue #22)
COUNT = 8


def _shared(algorithm: str) -> bool:
    return algorithm != "auto" and COLLECTIVES["allreduce"][algorithm].has("shared-memory")


# ----------------------------------------------------------------------------- the forms

def allreduce(form, x, *, algorithm, comm, timeout, **kw):
    if form == "blocking":
        return mpicoll.allreduce(x, algorithm=algorithm, comm=comm, timeout=timeout, **kw)
    if form == "nonblocking":
        return mpicoll.iallreduce(x, algorithm=algorithm, comm=comm, timeout=timeout,
                                  **kw).wait()
    out = np.empty(len(x)) if isinstance(x, list) else np.empty_like(x)
    return _once(mpicoll.allreduce_init(x, out, algorithm=algorithm, comm=comm,
                                        timeout=timeout, **kw))


def bcast(form, buf, root, *, algorithm, comm, timeout):
    if form == "blocking":
        return mpicoll.bcast(buf, root, algorithm=algorithm, comm=comm, timeout=timeout)
    if form == "nonblocking":
        return mpicoll.ibcast(buf, root, algorithm=algorithm, comm=comm, timeout=timeout).wait()
    return _once(mpicoll.bcast_init(buf, root, algorithm=algorithm, comm=comm, timeout=timeout))


def _once(handle):
    """Run a persistent handle once and free it: with ``mpi`` an unfreed handle's MPI request
    keeps its communicator -- one of MPICH's 2048 context ids per process -- alive, which
    ``--reps 20`` used up."""
    try:
        return handle()
    finally:
        try:
            handle.free()
        except RuntimeError:            # still started (a failed run): nothing more to do
            pass


# ----------------------------------------------------------------------------- the cases
# Each runs on every rank and returns (value, right): what the call returned and whether it is
# the right result; it may raise. ``t`` is the timeout.

def _sum(comm, count=COUNT):
    size = comm.Get_size()
    return np.full(count, size * (size + 1) / 2)


def _mine(comm, count=COUNT, dtype=np.float64):
    return np.full(count, comm.Get_rank() + 1, dtype)


def local_error(comm, a, form, t):
    x = [1.0] * COUNT if comm.Get_rank() == 0 else _mine(comm)
    y = allreduce(form, x, algorithm=a, comm=comm, timeout=t)
    return y, False


def count(comm, a, form, t):
    y = allreduce(form, _mine(comm, COUNT * (comm.Get_rank() + 1)), algorithm=a, comm=comm,
                  timeout=t)
    return y, False


def dtype(comm, a, form, t):
    x = _mine(comm, dtype=np.float32 if comm.Get_rank() == 0 else np.float64)
    return allreduce(form, x, algorithm=a, comm=comm, timeout=t), False


def op(comm, a, form, t):
    y = allreduce(form, _mine(comm), algorithm=a, comm=comm, timeout=t,
                  op=MPI.MAX if comm.Get_rank() == 0 else MPI.SUM)
    return y, False


def algorithm(comm, a, form, t):
    other = "recursive_doubling" if a == "ring" else "ring"
    y = allreduce(form, _mine(comm), algorithm=other if comm.Get_rank() == 0 else a, comm=comm,
                  timeout=t)
    return y, False


def skipped_callsite(comm, a, form, t):
    x = _mine(comm)
    if comm.Get_rank() == 0:
        allreduce(form, x + 100, algorithm=a, comm=comm, timeout=t, validate="callsite")
    y = allreduce(form, x, algorithm=a, comm=comm, timeout=t, validate="callsite")
    return y, bool(np.array_equal(y, _sum(comm)))


def skipped_default(comm, a, form, t):
    x = _mine(comm)
    if comm.Get_rank() == 0:
        allreduce(form, x + 100, algorithm=a, comm=comm, timeout=t)
    y = allreduce(form, x, algorithm=a, comm=comm, timeout=t)
    return y, bool(np.array_equal(y, _sum(comm)))


def skipped_then_other(comm, a, form, t):
    """Rank 0 makes the common call twice (the same arguments), then every rank makes another
    (count 4): the ranks meet at the second call with different arguments, and raise there.
    (The others' common call paired with rank 0's first: not catchable without call sites.)"""
    x = _mine(comm)
    if comm.Get_rank() == 0:
        allreduce(form, x, algorithm=a, comm=comm, timeout=t)
    allreduce(form, x, algorithm=a, comm=comm, timeout=t)
    y = allreduce(form, _mine(comm, 4), algorithm=a, comm=comm, timeout=t)
    return y, bool(np.array_equal(y, _sum(comm, 4)))


def root_self(comm, a, form, t):
    """Every rank passes root=self; then an all-reduce on the same communicator."""
    b = np.full(COUNT, float(comm.Get_rank()))
    bcast(form, b, comm.Get_rank(), algorithm=a, comm=comm, timeout=t)
    y = mpicoll.allreduce(_mine(comm), algorithm="ring", comm=comm, timeout=t)
    return (b, y), False


def roots_split(comm, a, form, t):
    """Ranks below N/2 pass root=0, the others root=N//2; then an all-reduce."""
    size = comm.Get_size()
    b = np.full(COUNT, float(comm.Get_rank()))
    bcast(form, b, 0 if comm.Get_rank() < size // 2 else size // 2, algorithm=a, comm=comm,
          timeout=t)
    y = mpicoll.allreduce(_mine(comm), algorithm="ring", comm=comm, timeout=t)
    return (b, y), False


def free_after_failure(comm, a, form, t):
    try:
        allreduce(form, _mine(comm, COUNT * (comm.Get_rank() + 1)), algorithm=a, comm=comm,
                  timeout=t)
    except (ArgumentMismatch, CollectiveTimeout, PeerError):
        pass
    start = time.monotonic()
    comm.Free()
    spent = time.monotonic() - start
    return f"freed in {spent:.3f} s", spent < 1.0


def free_in_flight(comm, a, form, t):
    """Every rank starts a request and frees the communicator; the last rank starts 0.2 s
    late, so the others' requests are surely in flight when they free it."""
    x = np.full(1 << 14, float(comm.Get_rank() + 1))
    if comm.Get_rank() == comm.Get_size() - 1:
        time.sleep(0.2)
    if form == "nonblocking":
        req = mpicoll.iallreduce(x, algorithm=a, comm=comm, timeout=t)
    else:
        req = mpicoll.allreduce_init(x, np.empty_like(x), algorithm=a, comm=comm, timeout=t)
        req.start()
    comm.Free()
    try:
        y = req.wait()
    finally:
        if form == "persistent":
            req.free()
    return y, bool(np.array_equal(y, _sum(MPI.COMM_WORLD, x.size)))   # (comm is freed)


def threads(comm, a, form, t):
    """Two threads of every rank call the same all-reduce 20 times on one communicator."""
    got, errors = [], []

    def body():
        try:
            for _ in range(20):
                got.append(allreduce(form, _mine(comm), algorithm=a, comm=comm, timeout=t))
        except Exception as exc:        # noqa: BLE001 - reported
            errors.append(exc)

    workers = [threading.Thread(target=body) for _ in range(2)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    wrong = sum(not np.array_equal(y, _sum(comm)) for y in got)
    if errors:
        first = next((e for e in errors if isinstance(e, ConcurrentCall)), errors[0])
        raise type(first)(f"{len(got) - wrong} right, {wrong} wrong; {first}")
    return f"{len(got)} calls", wrong == 0


def buckets_missed_ready(comm, a, form, t):
    """Rank 0 misses ready(1) once: every rank must raise for that step (its sums are not
    valid anywhere); then two normal steps: are the sums right everywhere?"""
    arrays = [np.zeros(COUNT), np.zeros(COUNT)]     # the gradients (Buckets copies them)
    b = mpicoll.Buckets(arrays, bucket_bytes=COUNT * 8, comm=comm, algorithm=a, timeout=t,
                        average=False)
    raised = False
    try:
        for i in (1, 0):
            arrays[i][:] = comm.Get_rank() + 1
            if not (i == 1 and comm.Get_rank() == 0):
                b.ready(i)
        b.wait()
    except ValueError:              # the step that went wrong, on every rank
        raised = True
    for _ in range(2):
        for i in (1, 0):
            arrays[i][:] = comm.Get_rank() + 1
            b.ready(i)
        b.wait()
    right = raised and all(np.array_equal(g, _sum(comm)) for g in arrays)
    return arrays[0][:1], right


def shm_vs_mpi(comm, a, form, t):
    y = mpicoll.allreduce(_mine(comm), algorithm="shm" if comm.Get_rank() == 0 else "mpi",
                          comm=comm, timeout=t)
    return y, False


def kernel_lock(comm, a, form, t):
    """Another process holds the kernel lock for 3 t; rank 0 must load a kernel."""
    from mpicoll import kernels
    from mpicoll.executors import compiled
    holder = None
    if comm.Get_rank() == 0:
        compiled._ready.discard(np.dtype(np.int16))
        holder = subprocess.Popen(
            [sys.executable, "-c", "import fcntl, sys, time; f = open(sys.argv[1], 'a'); "
             "fcntl.flock(f, fcntl.LOCK_EX); print('held', flush=True); time.sleep(float("
             "sys.argv[2]))", kernels.lock_path(), str(3 * t)], stdout=subprocess.PIPE, text=True)
        holder.stdout.readline()
    comm.Barrier()
    _measured_from[0] = time.monotonic()    # (the holder's start is not the call's time)
    try:
        y = allreduce(form, np.ones(COUNT, np.int16), algorithm=a, comm=comm, timeout=t)
        return y, bool(np.all(y == comm.Get_size()))
    finally:
        if holder is not None:
            holder.kill()
            holder.wait()


def peer_death(comm, a, form, t):
    """``--death``: the last rank dies in the call (``exit_in_next_call``); the others' outcome."""
    n = comm.Get_size()
    if comm.Get_rank() == n - 1:
        exit_in_next_call(_shared(a))
    y = allreduce(form, _mine(comm), algorithm=a, comm=comm, timeout=t)
    return y, bool((y == n * (n + 1) / 2).all())


# name -> (function, collective, forms, owner, what the docs promise)
CASES = {
    "local error": (local_error, "allreduce", FORMS, None,
                    "rank 0: its TypeError; the others: PeerError naming it, within 2 s"),
    "count mismatch": (count, "allreduce", FORMS, None, "ArgumentMismatch everywhere, within 2 s"),
    "dtype mismatch": (dtype, "allreduce", FORMS, None, "ArgumentMismatch everywhere, within 2 s"),
    "op mismatch": (op, "allreduce", FORMS, None, "ArgumentMismatch everywhere, within 2 s"),
    "algorithm mismatch": (algorithm, "allreduce", FORMS, None,
                           "ArgumentMismatch everywhere, within 2 s"),
    "skipped call (callsite)": (skipped_callsite, "allreduce", FORMS, None,
                                          "ArgumentMismatch everywhere, within 2 s"),
    "skipped call (default)": (skipped_default, "allreduce", ("blocking",), "limit",
                              "not caught: the extra call matches the others' (same arguments)"),
    "skipped call then another": (skipped_then_other, "allreduce", FORMS, None,
                                   "ArgumentMismatch everywhere at the next different call, "
                                   "within 2 s"),
    "root=self bcast": (root_self, "bcast", FORMS, None,
                        "an error on every rank, in the call or the next one, within 2 s"),
    "roots split bcast": (roots_split, "bcast", FORMS, None,
                          "an error on every rank, in the call or the next one, within 2 s"),
    "Free after failure": (free_after_failure, "allreduce", FORMS, None,
                           "the failure's error, then comm.Free() within 1 s"),
    "Free in flight": (free_in_flight, "allreduce", ("nonblocking", "persistent"), None,
                       "the right result (the request completes first), or CommunicatorBroken"),
    "threads": (threads, "allreduce", ("blocking",), None,
                "right results, and ConcurrentCall (or PeerError / CommunicatorBroken after "
                "it) on a thread that entered a busy communicator; never a wrong result"),
    "kernel lock held": (kernel_lock, "allreduce", ("blocking",), None,
                         "CollectiveTimeout everywhere within the deadline + 1 s, nobody "
                         "named as absent"),
    "Buckets missed ready": (buckets_missed_ready, "buckets", ("blocking",), None,
                             "ValueError on every rank for that step, later steps right "
                             "everywhere (reset on every error path)"),
    "shm vs mpi": (shm_vs_mpi, "allreduce", ("blocking",), None,
                   "ArgumentMismatch everywhere, within 2 s"),
    "peer death": (peer_death, "allreduce", ("blocking",), None,
                   "the others: ProcessFailed naming the dead rank (the failure detector), within "
                   "the deadline + 1 s, or the right result if its data was out (--death, last)"),
}
LAST = {"peer death"}       # run by --death only, after every other case: it ends a rank
HANGS: set = set()          # cases that hung once, run only with --include-hangs
ONCE = {"kernel lock held", "skipped call (default)", "Buckets missed ready", "shm vs mpi"}


# ----------------------------------------------------------------------------- judging

_measured_from = [None]      # a case may restart the clock once its set-up is done


def record(fn, comm, a, form, t) -> dict:
    start = time.monotonic()
    _measured_from[0] = None
    try:
        value, right = fn(comm, a, form, t)
        kind, text = "returned", "right" if right else "WRONG"
    except Exception as exc:            # noqa: BLE001 - what the rank saw
        kind, text, right = type(exc).__name__, str(exc), None
    start = _measured_from[0] or start
    return {"kind": kind, "text": text[:400], "right": right,
            "seconds": round(time.monotonic() - start, 3)}


def judge(case: str, records: list, t: float) -> str:
    """``ok``, ``FAIL: why``, or the owner's / limit label, from every rank's record."""
    _, _, _, owner, _ = CASES[case]
    kinds = [r["kind"] for r in records]
    slow = max(r["seconds"] for r in records)
    wrong = any(r["kind"] == "returned" and not r["right"] for r in records)
    errors = set(kinds) - {"returned"}

    def verdict(ok: bool, why: str) -> str:
        if owner == "limit":
            return "limit" if not ok else "ok"
        if owner is not None:
            return f"owner ({owner}): {'ok' if ok else why}"
        return "ok" if ok else f"FAIL: {why}"

    if case == "local error":
        ok = kinds[0] == "TypeError" and all(k == "PeerError" for k in kinds[1:])
        return verdict(ok and slow < FAST, f"{kinds} in {slow:.2f} s")
    if case in ("count mismatch", "dtype mismatch", "op mismatch", "algorithm mismatch",
                "skipped call (callsite)", "skipped call then another", "shm vs mpi"):
        ok = all(k == "ArgumentMismatch" for k in kinds)
        return verdict(ok and slow < FAST, f"{kinds} in {slow:.2f} s")
    if case == "skipped call (default)":
        return verdict(not wrong and not (errors - {"ArgumentMismatch", "PeerError"}),
                       f"{kinds}, a wrong result: {wrong}")
    if case in ("root=self bcast", "roots split bcast"):
        ok = not wrong and errors <= {"ArgumentMismatch", "PeerError"} and \
            "returned" not in kinds
        return verdict(ok and slow < FAST, f"{kinds} in {slow:.2f} s, wrong: {wrong}")
    if case == "Free after failure":
        return verdict(all(k == "returned" for k in kinds) and not wrong,
                       f"{kinds} {[r['text'] for r in records]}")
    if case == "Free in flight":
        ok = not wrong and errors <= {"CommunicatorBroken"}
        return verdict(ok and slow < t + 1, f"{kinds} in {slow:.2f} s, wrong: {wrong}")
    if case == "threads":
        ok = not wrong and errors <= {"ConcurrentCall", "PeerError", "CommunicatorBroken"} and \
            not any(int(m.group(1)) for r in records
                    for m in [re.search(r"(\d+) wrong", r["text"])] if m)
        return verdict(ok and slow < t + 1, f"{kinds} in {slow:.2f} s")
    if case == "kernel lock held":
        ok = all(k == "CollectiveTimeout" for k in kinds) and \
            not any("did not answer" in r["text"] for r in records)
        return verdict(ok and slow < t + 1, f"{kinds} in {slow:.2f} s")
    if case == "Buckets missed ready":
        return verdict(all(k == "returned" for k in kinds) and not wrong, f"{kinds}, wrong")
    if case == "peer death":            # records: the survivors' (the last rank is dead)
        names_dead = re.compile(rf"\brank(\(s\))? \[?([0-9]+, )*{len(records)}\b").search
        ok = not wrong and all(
            r["kind"] == "returned" or (r["kind"] in {"ProcessFailed", "CommunicatorBroken",
                                                      "CollectiveTimeout", "PeerError"}
                                        and names_dead(r["text"]))
            for r in records)
        return verdict(ok and slow < t + 1, f"{kinds} in {slow:.2f} s, wrong: {wrong}")
    raise KeyError(case)


def bounded_barrier(comm, seconds: float) -> bool:
    request, end = comm.Ibarrier(), time.monotonic() + seconds
    while not request.Test():
        if time.monotonic() > end:
            return False
        time.sleep(1e-3)
    return True


# ----------------------------------------------------------------------------- the run

def warm(world, algorithms, t: float) -> None:
    """Load every kernel and loop the cases use, with a generous deadline (not timed)."""
    comm = world.Dup()
    for a in algorithms:
        for dt in (np.float64, np.float32) + (() if _shared(a) else (np.int16,)):
            for opname in ("sum", "max"):
                mpicoll.allreduce(np.ones(COUNT, dt), algorithm=a, comm=comm, op=opname,
                                  timeout=600)
    for a in BCAST:
        mpicoll.bcast(np.ones(COUNT), 0, algorithm=a, comm=comm, timeout=600)
    mpicoll.iallreduce(np.ones(COUNT), comm=comm, timeout=600).wait()
    comm.Free()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help=f"algorithms {', '.join(QUICK)} only")
    ap.add_argument("--algorithms", default=None, help="comma-separated (default: all and auto)")
    ap.add_argument("--cases", default=None, help="comma-separated case names (default: all)")
    ap.add_argument("--timeout", type=float, default=5.0, help="each call's timeout (s)")
    ap.add_argument("--reps", type=int, default=None,
                    help="repeat every case this many times (default 1)")
    ap.add_argument("--include-hangs", action="store_true",
                    help="also run the cases in HANGS (none now; one that may hang aborts)")
    ap.add_argument("--json", default=None)
    ap.add_argument("--markdown", default=None, help="rewrite the table in this file")
    ap.add_argument("--death", default=None, metavar="ALGO",
                    help="last, a rank's death in a call of ALGO (needs mpiexec "
                         "-disable-auto-cleanup; the job then ends without MPI_Finalize)")
    ap.add_argument("--elastic", action="store_true",
                    help="issue 42's section instead: training through deaths (launches its "
                         "own mpiexec jobs of train_dp.py; run it without mpiexec)")
    args = ap.parse_args(argv)
    if args.reps is None:
        args.reps = 1
    if args.elastic:
        return elastic_matrix(args.reps, args.markdown, args.json)
    world = MPI.COMM_WORLD
    rank, size = world.Get_rank(), world.Get_size()
    t = args.timeout
    algorithms = tuple(args.algorithms.split(",")) if args.algorithms else \
        QUICK if args.quick else ALGORITHMS
    cases = args.cases.split(",") if args.cases else [
        c for c in CASES if args.include_hangs or c not in HANGS]
    cases = [c for c in cases if c not in LAST]
    if size < 3:
        cases = [c for c in cases if c != "roots split bcast"]
    nodes = len(testing.nodes(world))
    if nodes > 1:           # shm refuses a layout across nodes, on every rank: not a fault
        algorithms = tuple(a for a in algorithms if a == "auto" or not _shared(a))
        cases = [c for c in cases if c != "shm vs mpi"]
        if rank == 0:
            print(f"# the ranks span {nodes} nodes: shared-memory algorithms and the 'shm vs "
                  f"mpi' case left out", flush=True)
    started = time.monotonic()
    warm(world, [a for a in algorithms if a in COLLECTIVES["allreduce"] or a == "auto"], t)
    if rank == 0:
        load = os.getloadavg()[0]
        print(f"# fault matrix: N={size}, timeout {t:g} s, {args.reps} rep(s), load average "
              f"{load:.1f}; {MPI.Get_library_version().splitlines()[0].strip()}", flush=True)
    results, failed = [], 0
    for case in cases:
        fn, collective, forms, _, _ = CASES[case]
        names = BCAST if collective == "bcast" else algorithms
        if collective == "bcast" and args.quick:
            names = ("binomial", "ring", "mpi", "auto")
        if case in ONCE:
            names = ("ring",)
        for a in names:
            if a not in BCAST + ALGORITHMS:
                continue
            for form in forms:
                if form == "nonblocking" and collective != "bcast" and _shared(a):
                    continue                # shm has no nonblocking form
                if case == "threads" and _shared(a):
                    continue
                verdicts, slowest, records = [], [], None
                for _ in range(args.reps):
                    comm = world.Dup()
                    try:                    # a matching call first (warm, prepared path)
                        if collective == "bcast":
                            bcast(form, np.ones(COUNT), 0, algorithm=a, comm=comm, timeout=600)
                        elif collective == "allreduce" and case != "kernel lock held":
                            allreduce(form, _mine(comm), algorithm=a, comm=comm, timeout=600)
                    except Exception as exc:    # noqa: BLE001
                        print(f"rank {rank}: warm-up of {case} {a} {form} failed: {exc}",
                              flush=True)
                    world.Barrier()
                    mine = record(fn, comm, a, form, t)
                    if not bounded_barrier(world, t + 15):
                        print(f"HANG {case} {a} {form}: rank {rank} waited {t + 15:g} s for the "
                              "others to come back; aborting", flush=True)
                        sys.stdout.flush()
                        world.Abort(3)
                    records = world.gather(mine, 0)
                    if comm != MPI.COMM_NULL:   # (MPI has ~2000 communicators: free each)
                        try:
                            comm.Free()
                        except MPI.Exception:
                            pass
                    if rank == 0:
                        verdicts.append(judge(case, records, t))
                        slowest.append(max(rec["seconds"] for rec in records))
                if rank != 0:
                    continue
                worst = next((v for v in verdicts if v.startswith("FAIL")), None) or \
                    next((v for v in verdicts if v != "ok"), "ok")
                failed += worst.startswith("FAIL")
                results.append(report_row(case, a, form, worst, records, verdicts, slowest))
    if args.death and (nodes == 1 or not _shared(args.death)):
        row = death(world, args.death, t)
        if row is not None:
            failed += row["verdict"].startswith("FAIL")
            results.append(row)
    if rank == 0:
        print(f"# {len(results)} rows, {failed} FAIL, {time.monotonic() - started:.0f} s",
              flush=True)
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"size": size, "timeout": t, "reps": args.reps, "rows": results}, f,
                          indent=1)
        if args.markdown:
            update_markdown(args.markdown, table(results, size, t, args.reps), size)
    if args.death:                      # a rank is dead: MPI_Finalize could wait for it
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1 if failed else 0)
    return 1 if failed else 0


def death(world, a: str, t: float):
    """The ``--death`` case: the last rank of ``world`` dies in a call of ``a``; return the
    row (on rank 0 of the survivors; None elsewhere). The dying rank does not return."""
    rank, size = world.Get_rank(), world.Get_size()
    survivors = world.Split(0 if rank < size - 1 else MPI.UNDEFINED)    # before it dies
    comm = world.Dup()
    # (not shm: every rank on the Python executor, which waits in a Watch.wait every step)
    with environment(**({} if _shared(a) else {"MPICOLL_EXECUTOR": "python"})):
        allreduce("blocking", _mine(comm), algorithm=a, comm=comm, timeout=600)
        world.Barrier()
        mine = record(peer_death, comm, a, "blocking", t)
    records = survivors.gather(mine, 0)
    if rank != 0:
        return None
    verdict = judge("peer death", records, t)
    return report_row("peer death", a, "blocking", verdict, records, [verdict],
                      [max(rec["seconds"] for rec in records)], also=f"; {size - 1}: exited")


def report_row(case: str, a: str, form: str, verdict: str, records: list, verdicts: list,
               slowest: list, also: str = "") -> dict:
    """Print one case's line (and, if not ok, why, with what ranks 0 and 1 saw); its row."""
    shown = "; ".join(f"{r}: {rec['kind']} {rec['seconds']:.2f} s"
                      for r, rec in enumerate(records))
    print(f"{verdict.split(':')[0]:<6} {case:<34} {a:<19} {form:<11} {shown}{also}", flush=True)
    if verdict != "ok":
        saw = "".join(f" | rank {r} saw: {rec['text'][:200]}" for r, rec in enumerate(records[:2]))
        print(f"       {verdict[:300]}{saw}", flush=True)
    return {"case": case, "algorithm": a, "form": form, "verdict": verdict,
            "owner": CASES[case][3], "promise": CASES[case][4], "ranks": records,
            "verdicts": verdicts, "slowest": slowest}


def table(results: list, size: int, t: float, reps: int) -> str:
    """One row per case: the promise, and per algorithm the verdict over the forms and the
    slowest rank's time to error."""
    algorithms = []
    for r in results:
        if r["algorithm"] not in algorithms:
            algorithms.append(r["algorithm"])
    again = f" --reps {reps}" if reps > 1 else ""
    died = [r["algorithm"] for r in results if r["case"] == "peer death"]
    launch = "mpiexec -disable-auto-cleanup" if died else "mpiexec"
    death = f" --death {died[0]}" if died else ""
    lines = [f"N = {size}, timeout {t:g} s, {reps} repetition(s) (`{launch} -n {size} python -m "
             f"mpi4py jobs/experiments/fault_matrix.py{again}{death} "
             "--markdown docs/reliability.md`): per "
             "algorithm, the worst verdict over the forms run (blocking, nonblocking, "
             "persistent) and repetitions, and the slowest rank's time to error (or to return), "
             "the largest over them" + ("; the peer death, once, last." if died else "."), "",
             "| case | promise | " + " | ".join(f"`{a}`" for a in algorithms) + " |",
             "|---|---|" + "---|" * len(algorithms)]
    for case in dict.fromkeys(r["case"] for r in results):
        cells = []
        for a in algorithms:
            rows = [r for r in results if r["case"] == case and r["algorithm"] == a]
            if not rows:
                cells.append("")
                continue
            worst = next((r["verdict"] for r in rows if r["verdict"].startswith("FAIL")),
                         None) or next((r["verdict"] for r in rows if r["verdict"] != "ok"), "ok")
            slow = max(max(r.get("slowest") or [rec["seconds"] for rec in r["ranks"]])
                       for r in rows)
            label = worst.split(":")[0] if not worst.startswith("owner") else \
                worst.split(":")[0] + (" ok" if worst.endswith(": ok") else " fails")
            cells.append(f"{label} {slow:.2f} s")
        promise = CASES[case][4].replace("|", "/")
        lines.append(f"| {case} | {promise} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


# ----------------------------------------------------------------------------- --elastic

RECOVERY = 3.0      # seconds from a death to the first step on the survivors (issue 42), N <= 5
TRAINER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "train_dp.py")
SMALL_TRAINING = ("--steps", "50", "--width", "32")
# name -> (ranks launched, train_dp.py options, ranks training at the end, reproducible)
ELASTIC = {
    "one death, 4 -> 3": (4, ("--kill", "2@37"), 3, True),
    "rank 0 dies": (4, ("--kill", "0@20"), 3, True),
    "two deaths, 4 -> 3 -> 2": (4, ("--kill", "2@37", "--kill", "1@43"), 2, True),
    "two deaths in one step, 4 -> 2": (4, ("--kill", "1@30", "--kill", "2@30"), 2, True),
    "a spare joins, 4 + 1 -> 4": (5, ("--spares", "1", "--kill", "2@37"), 4, True),
    "a spare joins, then 4 -> 3": (5, ("--spares", "1", "--kill", "2@37", "--kill", "1@43"), 3,
                                   True),
    "a death during async checkpoints": (4, ("--checkpoint", "{out}/ckpt", "--checkpoint-every",
                                             "5", "--kill", "3@27"), 3, True),
    "one death, fp32 Buckets (1e-6)": (4, ("--kill", "3@10"), 3, False),
}


def elastic_launch(ranks: int, options, out: str) -> dict:
    """One train_dp.py job; {world rank: the survivor's row} and its weights (lowest rank)."""
    os.makedirs(out, exist_ok=True)
    options = [o.format(out=out) for o in options]
    mpiexec = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    started = time.monotonic()
    proc = subprocess.run([mpiexec if os.path.exists(mpiexec) else "mpiexec",
                           "-disable-auto-cleanup", "-n", str(ranks), sys.executable, "-m",
                           "mpicoll", "survive", sys.executable, TRAINER, *SMALL_TRAINING,
                           "--outdir", out, *options],
                          capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, MPIEXEC_TIMEOUT="240"))
    rows = {}
    for r in range(ranks):
        path = os.path.join(out, f"train_dp_elastic.rank{r}.json")
        if os.path.exists(path):
            with open(path) as f:
                row = json.load(f)
            if not row.get("spare"):
                rows[r] = row
    weights = os.path.join(out, "weights.npz")
    params = None
    if os.path.exists(weights):
        with np.load(weights) as z:
            params = np.concatenate([z[k].reshape(-1) for k in sorted(z.files,
                                                                          key=lambda k: int(k[4:]))])
    return {"rows": rows, "weights": params, "seconds": time.monotonic() - started,
            "tail": (proc.stdout + proc.stderr)[-600:]}


def elastic_verdict(run: dict, plain: dict, killed: set, ranks_end: int,
                    reproducible: bool) -> str:
    rows = run["rows"]
    if not rows:
        return f"FAIL: no survivor wrote its result ({run['tail']!r})"
    ends = {row["ranks_end"] for row in rows.values()}
    if ends != {ranks_end}:
        return f"FAIL: the survivors end with {sorted(ends)} ranks, not {ranks_end}"
    digests = {row["weights_sha256"] for row in rows.values()}
    want = next(iter(plain["rows"].values()))["weights_sha256"]
    if reproducible and digests != {want}:
        return f"FAIL: weights {sorted(d[:12] for d in digests)}, not {want[:12]}"
    if not reproducible:
        if len(digests) != 1 or run["weights"] is None:
            return f"FAIL: the survivors hold {len(digests)} different weights"
        rel = float(np.abs(run["weights"] - plain["weights"]).max()
                    / np.abs(plain["weights"]).max())
        if rel > 1e-6:
            return f"FAIL: weights {rel:.2e} relative from the uninterrupted run's"
    recovery = [s for row in rows.values() for s in row["recovery_seconds"]]
    deaths = len({kill.split("@")[1] for kill in killed})     # ("RANK@STEP" options)
    if killed and (not recovery or max(recovery) >= RECOVERY):
        return f"FAIL: recovery {recovery} s (bound {RECOVERY:g} s, {deaths} death steps)"
    return "ok"


def elastic_matrix(reps: int, markdown: str | None, json_path: str | None) -> int:
    """``--elastic``: every case of ``ELASTIC``, ``reps`` times (the worst verdict)."""
    base = tempfile.mkdtemp(prefix="mpicoll-elastic-matrix-")
    print(f"# elastic fault matrix: {len(ELASTIC)} cases x {reps}, train_dp.py "
          f"{' '.join(SMALL_TRAINING)}, load average {os.getloadavg()[0]:.1f}",
          flush=True)
    plain = {flag: elastic_launch(4, ("--reproducible",) if flag else ("--elastic",),
                                  os.path.join(base, f"plain-{flag}"))
             for flag in (True, False)}
    results, failed = [], 0
    for case, (ranks, options, end, reproducible) in ELASTIC.items():
        verdicts, recovery, seconds = [], [], []
        killed = {o for o in options if "@" in o}
        for rep in range(reps):
            out = os.path.join(base, f"{len(results)}-{rep}")
            run = elastic_launch(ranks, (*options, "--reproducible") if reproducible else
                                 options, out)
            verdicts.append(elastic_verdict(run, plain[reproducible], killed, end,
                                            reproducible))
            recovery += [s for row in run["rows"].values() for s in row["recovery_seconds"]]
            seconds.append(run["seconds"])
        worst = next((v for v in verdicts if v != "ok"), "ok")
        failed += worst != "ok"
        row = {"case": case, "ranks": ranks, "options": list(options), "ranks_end": end,
               "reproducible": reproducible, "verdict": worst, "verdicts": verdicts,
               "recovery_seconds": recovery, "job_seconds": seconds}
        results.append(row)
        shown = f"{min(recovery):.2f}-{max(recovery):.2f} s" if recovery else "-"
        print(f"{worst.split(':')[0]:<6} {case:<34} recovery {shown}", flush=True)
        if worst != "ok":
            print(f"       {worst[:400]}", flush=True)
    print(f"# {len(results)} rows, {failed} FAIL", flush=True)
    shutil.rmtree(base, ignore_errors=True)         # the jobs' outputs (the rows keep theirs)
    if json_path:
        with open(json_path, "w") as f:
            json.dump({"reps": reps, "rows": results}, f, indent=1)
    if markdown:
        lines = [f"{reps} repetition(s) of each case (`python jobs/experiments/fault_matrix.py "
                 f"--elastic{f' --reps {reps}' if reps > 1 else ''} --markdown docs/elastic.md`"
                 f"; `train_dp.py {' '.join(SMALL_TRAINING)}`, N = 4 on one node): the verdict "
                 f"(weights as the uninterrupted run's, the rank count at the end, each recovery "
                 f"under {RECOVERY:g} s) and every recovery measured.", "",
                 "| case | launch | ranks at the end | weights against the uninterrupted run "
                 "| verdict | recovery (s) |", "|---|---|---|---|---|---|"]
        for r in results:
            launch = f"-n {r['ranks']} {' '.join(r['options']).replace('{out}/', '')}"
            lines.append(f"| {r['case']} | `{launch}` | {r['ranks_end']} | "
                         f"{'same sha256' if r['reproducible'] else 'within 1e-6'} | "
                         f"{r['verdict'].split(':')[0]} | "
                         f"{', '.join(f'{s:.2f}' for s in r['recovery_seconds']) or '-'} |")
        update_markdown(markdown, "\n".join(lines), "elastic")
    return 1 if failed else 0


def update_markdown(path: str, text: str, size) -> None:
    with open(path) as f:
        doc = f.read()
    tag = size if size == "elastic" else f"N={size}"
    start, end = f"<!-- fault-matrix {tag} -->", f"<!-- /fault-matrix {tag} -->"
    block = f"{start}\n{text}\n{end}"
    if start in doc:
        doc = re.sub(re.escape(start) + ".*?" + re.escape(end), lambda _: block, doc,
                     flags=re.S)
    else:
        doc = doc.rstrip("\n") + "\n\n" + block + "\n"
    with open(path, "w") as f:
        f.write(doc)


if __name__ == "__main__":
    sys.exit(main())
