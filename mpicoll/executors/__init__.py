"""Executors: they run schedules (``mpicoll.schedule``), the algorithms stay the same.

* ``mpi``       -- over mpi4py's buffer point-to-point calls: the real thing;
* ``compiled``  -- the same steps in one numba-compiled loop calling libmpi directly (the
  default where it can run; ``MPICOLL_EXECUTOR``);
* ``progress``  -- the same plan stepped without blocking, by a progress thread (nonblocking
  collectives, ``Buckets``, wire compression);
* ``inprocess`` -- P virtual ranks in one process: matching, deadlock and overlap checks, an
  alpha-beta-gamma clock, traces and byte counts (also importable as ``mpicoll.simulate``);
* ``timed``     -- the same schedules with no data, as all-ranks waves (``allranks``), over a
  modelled GPU cluster (``fabric``): per-rank finish times up to ~25,000 ranks
  (``mpicoll simulate``, docs/simulator.md);
* ``sockets``   -- over plain TCP between processes on one machine, no MPI: byte counts, and a
  timeout naming a silent peer (the seeds' Lab 01; ``jobs/labs/lab_sockets.py``).
"""
