"""One module per algorithm: ``<collective>_<algorithm>.py``, each with ``schedule`` and ``cost``.

Every one is in the registry (``mpicoll.registry``) but ``alltoall_pairwise``: a building block
of ``mpicoll.reproducible`` (its exchange of values), not a collective of mpicoll's API."""
