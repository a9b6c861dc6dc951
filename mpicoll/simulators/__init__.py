"""Simulators: the same schedules as ``mpicoll.executors`` runs, with no network.

* ``inprocess`` -- P virtual ranks in one process: matching, deadlock and overlap checks, an
  alpha-beta-gamma clock, traces and byte counts (``mpicoll trace``, the exhaustive tests);
* ``timed``     -- the schedules with no data, as all-ranks waves (``allranks``), over a
  modelled GPU cluster (``fabric``): per-rank finish times up to ~25,000 ranks
  (``mpicoll simulate``, docs/simulator.md); its compiled kernels and max-min sharing in
  ``sharing``, NCCL's tuning model in ``nccl_tuning``, the switches reducing (NVLS, NVLSTree, CollNet)
  in ``innetwork``, a
  training step (compute, TP all-reduces, overlapped DP buckets) in ``workload``.
"""
