"""One module per algorithm: ``<collective>_<algorithm>.py``, each with ``schedule`` and ``cost``."""
