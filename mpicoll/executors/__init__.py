"""Executors: they run schedules (``mpicoll.schedule``), the algorithms stay the same.

* ``mpi``       -- over mpi4py's buffer point-to-point calls: the real thing;
* ``progress``  -- the same plan stepped without blocking, by a progress thread (nonblocking
  collectives, ``Buckets``, wire compression);
* ``inprocess`` -- P virtual ranks in one process: matching, deadlock and overlap checks, an
  alpha-beta-gamma clock, traces and byte counts (also importable as ``mpicoll.simulate``).
"""
