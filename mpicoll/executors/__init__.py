"""Executors: they run schedules (``mpicoll.schedule``) for real, the algorithms stay the same.

* ``python``    -- over mpi4py's buffer point-to-point calls: the real thing;
* ``compiled``  -- the same steps in one numba-compiled loop calling libmpi directly (the
  default where it can run; ``MPICOLL_EXECUTOR``);
* ``progress``  -- the same plan stepped without blocking, by a progress thread (nonblocking
  collectives, ``Buckets``, wire compression);
* ``background``-- a communicator's first nonblocking calls, started by a thread of their own
  while its set-up (``MPI_Comm_idup``, the node layout) completes;
* ``shared``    -- the shared-memory runner (``shm``, hierarchical's node phases);
* ``sockets``   -- over plain TCP between processes on one machine, no MPI: byte counts, and a
  timeout naming a silent peer (the seeds' Lab 01; ``jobs/labs/lab_sockets.py``).

The same schedules also run without a network, in ``mpicoll.simulators``.
"""
