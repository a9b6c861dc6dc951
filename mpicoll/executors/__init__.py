"""Executors: they run schedules (``mpicoll.schedule``), the algorithms stay the same.

* ``mpi``       -- over mpi4py's buffer point-to-point calls: the real thing;
* ``compiled``  -- the same steps in one numba-compiled loop calling libmpi directly (the
  default where it can run; ``MPICOLL_EXECUTOR``);
* ``inprocess`` -- P virtual ranks in one process: matching, deadlock and overlap checks, an
  alpha-beta-gamma clock, traces and byte counts (also importable as ``mpicoll.simulate``).
"""
