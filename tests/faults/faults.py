"""Fault injection for the timeout tests: run under ``mpiexec -n 3`` by tests/jobs/test_faults.py.

    mpiexec -n 3 python tests/faults/faults.py CASE --out DIR [--timeout T] [--algorithms a,b]

Rank 2 is the faulty one; the others call collectives with ``timeout=T``. Each rank writes one
JSON line per call it made (``rank``, ``collective``, ``algorithm``, ``first``, ``error``,
``peers``, ``gave_up``, ``elapsed``, ``message``) to ``DIR/rank<r>.jsonl``, then a last line
``{"done": true}``, and ends with ``os._exit`` (MPI_Finalize could wait for a dead rank). Cases:

* ``absent``: rank 2 never enters the call -- on a warm communicator for every algorithm of every
  collective, and on a fresh one (the first call) for every all-reduce algorithm; the survivors
  then call again on the same communicator and must get ``CommunicatorBroken``.
* ``late``: rank 2 enters only after the others gave up: it must fail at once, not after its own
  (long) timeout.
* ``exit`` / ``kill``: rank 2 ``os._exit(0)``s / SIGKILLs itself in the middle of the call: at
  its wait in step 1 (step 0 if it has one step; in the MPI library's own collective, right
  after starting it). If its data was already out, the others may still finish, correctly
  (``correct``); if not, they must raise naming it. Under ``shm`` it dies as shm's copy loop
  starts, its window ready: the others see its process gone (``CommunicatorBroken``).
* ``abort``: rank 2 never enters; the others run with ``MPICOLL_ON_TIMEOUT=abort`` (set by the
  test) and must bring the job down. Their ``except`` block prints ``REACHED USER CODE``, which
  must never appear: the abort is final.
* ``world``: rank 2 never enters the *first* call on ``MPI.COMM_WORLD`` itself (no ``Dup``); the
  survivors get ``CollectiveTimeout``, then every rank ends normally, through ``MPI_Finalize``,
  which must not report "Builtin communicator ... has pending references".
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import os
import signal
import time

import numpy as np
from mpi4py import MPI

import mpicoll
from mpicoll import settings
from mpicoll._runtime import watch
from mpicoll.registry import COLLECTIVES

FAULTY = 2


def call(collective: str, algorithm: str, comm, **options):
    """One call of ``collective`` with small inputs (bcast from the faulty rank, so all wait)."""
    if collective == "bcast":
        return mpicoll.bcast(np.ones(1000), FAULTY, algorithm=algorithm, comm=comm, **options)
    n = 1000 * comm.Get_size() if collective == "reduce_scatter_block" else 1000
    return getattr(mpicoll, collective)(np.ones(n), algorithm=algorithm, comm=comm, **options)


OUT = None


def write(row: dict) -> None:
    OUT.write(json.dumps(row) + "\n")
    OUT.flush()


def report(comm, collective, algorithm, first, fn) -> None:
    start = time.monotonic()
    row = {"rank": comm.Get_rank(), "collective": collective, "algorithm": algorithm,
           "first": first, "error": None, "peers": None, "gave_up": None}
    try:
        out = fn()
        row["correct"] = bool((out == comm.Get_size()).all()) if collective == "allreduce" else None
    except Exception as exc:      # noqa: BLE001 - reported to the test
        row.update(error=type(exc).__name__, message=str(exc),
                   peers=getattr(exc, "peers", None), gave_up=getattr(exc, "gave_up", None))
    row["elapsed"] = round(time.monotonic() - start, 3)
    write(row)


def absent(world, timeout, cases) -> None:
    for collective, algorithm, first in cases:
        comm = world.Dup()
        if not first:
            call(collective, algorithm, comm)
        if world.Get_rank() != FAULTY:
            report(comm, collective, algorithm, first,
                   lambda: call(collective, algorithm, comm, timeout=timeout))
            report(comm, collective, "again", first,
                   lambda: call(collective, algorithm, comm, timeout=timeout))


def late(world, timeout, algorithm) -> None:
    # Ranks 0 and 1 must both time out by themselves (each before the other's roll call
    # reaches it), so their clocks must start within a poll (~1 ms) of each other: the Python
    # executor leaves a call in step that closely; the compiled one, on a loaded machine, not
    # always. The roll call under test is the Watch's, the same for both executors.
    os.environ["MPICOLL_EXECUTOR"] = "python"
    settings.reload()
    comm = world.Dup()
    call("allreduce", algorithm, comm)
    if world.Get_rank() == FAULTY:
        time.sleep(timeout + watch.ROLL_CALL_SECONDS + 1.0)
        report(comm, "allreduce", algorithm, False,
               lambda: call("allreduce", algorithm, comm, timeout=60.0))
    else:
        report(comm, "allreduce", algorithm, False,
               lambda: call("allreduce", algorithm, comm, timeout=timeout))
        time.sleep(2.0 + watch.ROLL_CALL_SECONDS)       # stay alive while rank 2 comes late


def dies(world, timeout, algorithm, how) -> None:
    comm = world.Dup()
    # every rank on the Python executor, which waits in a Watch.wait every step (the compiled
    # one only in a step that outlasts its spin): the executor is part of the call's signature
    # (ranks on different executors get ArgumentMismatch), so all ranks run the same one
    os.environ["MPICOLL_EXECUTOR"] = "python"
    settings.reload()
    call("allreduce", algorithm, comm)

    def die(step) -> None:
        write({"rank": FAULTY, "dies": how, "at_step": step})
        if how == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        os._exit(0)

    if world.Get_rank() == FAULTY and algorithm == "shm":
        # shm waits in its numba loop, not in a Watch: die as the loop starts (the window is
        # ready and the others wait for this rank's flag)
        from mpicoll.shm import kernels as shm_kernels
        shm_kernels.window_copy = lambda *args: die("window_copy")
    elif world.Get_rank() == FAULTY:        # dies in a Watch.wait, mid-schedule
        real_wait = watch.Watch.wait

        def dying_wait(self, requests, step, nsteps=0, *args, **kwargs):
            if isinstance(step, str) or step == min(1, nsteps - 1):      # mid-schedule
                die(step)
            return real_wait(self, requests, step, nsteps, *args, **kwargs)

        watch.Watch.wait = dying_wait
    report(comm, "allreduce", algorithm, False,
           lambda: call("allreduce", algorithm, comm, timeout=timeout))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("case", choices=["absent", "late", "exit", "kill", "abort", "world"])
    parser.add_argument("--out", required=True, help="directory for the rank<r>.jsonl files")
    parser.add_argument("--timeout", type=float, default=1.0)
    parser.add_argument("--algorithms", default="", help="all-reduce algorithms (default all)")
    args = parser.parse_args()
    # Hydra, started with -disable-auto-cleanup, tells the survivors of a killed rank with
    # SIGUSR1, which would end Python; mpicoll's own detection is what is under test here.
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)
    faulthandler.enable()
    world = MPI.COMM_WORLD
    global OUT
    OUT = open(os.path.join(args.out, f"rank{world.Get_rank()}.jsonl"), "w")
    algorithms = args.algorithms.split(",") if args.algorithms else list(mpicoll.ALGORITHMS)
    if args.case == "absent":
        cases = [(c, a, False) for c in COLLECTIVES for a in COLLECTIVES[c]
                 if c != "allreduce" or a in algorithms]
        cases += [("allreduce", a, True) for a in algorithms]
        absent(world, args.timeout, cases)
    elif args.case == "late":
        late(world, args.timeout, algorithms[0])
    elif args.case in ("exit", "kill"):
        dies(world, args.timeout, algorithms[0], args.case)
    elif args.case == "world":
        if world.Get_rank() == FAULTY:
            time.sleep(args.timeout + watch.ROLL_CALL_SECONDS + 1.0)
        else:
            report(world, "allreduce", algorithms[0], True,
                   lambda: call("allreduce", algorithms[0], world, timeout=args.timeout))
        write({"rank": world.Get_rank(), "done": True})
        OUT.close()
        world.Barrier()
        return                          # MPI_Finalize at exit, as a normal program ends
    else:
        comm = world.Dup()
        # every rank is here, but the first call waits for the slowest rank's numba warm-up:
        # not the 1 s of the environment on a loaded machine
        call("allreduce", algorithms[0], comm, timeout=60.0)
        if world.Get_rank() == FAULTY:
            time.sleep(60)
        else:
            try:
                call("allreduce", algorithms[0], comm)    # timeout and abort from the env
            except BaseException as exc:    # noqa: BLE001 - must not happen: abort is final
                print(f"REACHED USER CODE on rank {world.Get_rank()}: {exc!r}", flush=True)
                write({"rank": world.Get_rank(), "reached_user_code": repr(exc)})
                raise
    write({"rank": world.Get_rank(), "done": True})
    if args.case in ("absent", "late"):
        world.Barrier()                 # every rank alive: leave together
    os._exit(0)


if __name__ == "__main__":
    main()
