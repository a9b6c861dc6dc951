"""The work the default deadline adds to one step of the compiled executor, in CPU time.

    python tests/internals/deadline_work.py

No peer to wait for, so no other process's load in the numbers: a one-step schedule that
sends to and receives from its own rank (the receive reduced), run by ``compiled.execute``
blocking and under a deadline (with a fresh ``Watch`` per call, as a plain call makes),
interleaved, 21 batches of 2000 calls, medians of ``time.process_time``. What it measures is
the deadline's Python work per call (the ``Watch``, ``_run_watched``'s clocks) and the
polled ``MPI_Testall`` instead of ``MPI_Waitall`` for a step that is already complete; not
the polling of a step that must wait (``jobs/experiments/reliability_cost.py``). docs/reliability.md
quotes it.

The second line of each size times the same step as a prepared plain call runs it
(``compiled.Reusable``, kept by the cache's ``plan.Prepared``): blocking, and under a deadline kept in
``MPI_Wtime``'s clock, with the ``Watch`` made only if the step outlasts the loop's spin (here
never), the per-call closure that would make it included.

It drives mpicoll's private pieces (the executor, the ``Watch``), so it sits with the tests,
which may import them; jobs/ use the public API only.
"""

import time

import numpy as np
from mpi4py import MPI

from mpicoll._runtime.watch import Watch
from mpicoll.executors import compiled
from mpicoll.executors.python import new_traffic
from mpicoll.schedule import Recv, Schedule, Send


def main() -> int:
    comm = MPI.COMM_SELF.Dup()
    for n in (1, 8192):
        measure(comm, n)
    return 0


def measure(comm, n: int, batches: int = 21, calls: int = 2000) -> None:
    buf, scratch, traffic = np.ones(n), np.empty(n), new_traffic()
    sched = Schedule(((Recv(0, 0, n, True), Send(0, 0, n)),))

    def blocking():
        compiled.execute(sched, buf, comm, op="sum", tag=5, scratch=scratch, traffic=traffic)

    def deadline():
        compiled.execute(sched, buf, comm, op="sum", tag=5, scratch=scratch, traffic=traffic,
                         watch=Watch(600.0, "allreduce", comm))

    off, on = _interleaved({"blocking": blocking, "deadline": deadline}, batches, calls)
    print(f"{n * 8:>6} B step to itself: blocking {off:.2f} us, under a deadline {on:.2f} us "
          f"(+{on - off:.2f} us, the Watch included)", flush=True)
    reusable = compiled.Reusable(sched, buf.dtype, comm, op="sum", scratch=scratch,
                                 traffic=traffic)

    def prepared_blocking():
        reusable.run(buf, 5)

    def prepared_deadline():
        def make_watch(left):
            return Watch(600.0, "allreduce", comm)
        reusable.run(buf, 5, 600.0, make_watch)

    off, on = _interleaved({"blocking": prepared_blocking, "deadline": prepared_deadline},
                           batches, calls)
    print(f"{n * 8:>6} B step to itself, prepared call: blocking {off:.2f} us, under a deadline "
          f"{on:.2f} us (+{on - off:.2f} us)", flush=True)


def _interleaved(forms: dict, batches: int, calls: int) -> tuple:
    """The median CPU time per call of each form, the forms taking turns batch by batch."""
    for form in forms.values():
        for _ in range(calls):
            form()
    times = {name: [] for name in forms}
    for _ in range(batches):
        for name, form in forms.items():
            t0 = time.process_time()
            for _ in range(calls):
                form()
            times[name].append((time.process_time() - t0) / calls * 1e6)
    return tuple(float(np.median(times[name])) for name in forms)


if __name__ == "__main__":
    raise SystemExit(main())
