"""PyTorch's ``torch.distributed`` on mpicoll's collectives: a ``"mpicoll"`` backend for CPU tensors.

    import mpicoll.torch                              # registers the "mpicoll" backend
    torch.distributed.init_process_group("mpicoll")   # under mpiexec / srun: no MASTER_ADDR
    # launch: mpiexec -n 4 python train.py

Importing this module (``pip install mpicoll[torch]``; docs/torch.md) does two things and
starts nothing (MPI starts at ``init_process_group``):

* registers the backend (``torch.distributed.Backend.register_backend("mpicoll", ...)``): a
  ``ProcessGroupMpicoll`` (``mpicoll.torch.backend``) whose collectives run ``mpicoll``'s
  public calls on the tensors' own memory (and ``dist.monitored_barrier`` on its groups raises
  the backend's ``NotImplementedError``, where torch's own check raised a ValueError first);
* lets the ``env://`` rendezvous -- what ``init_process_group`` uses when given no
  ``init_method`` -- take ranks from MPI when ``MASTER_ADDR`` is not set
  (``mpicoll.torch.rendezvous``), and adds ``init_method="mpi://"`` which always does.

``compress_hook("bf16" | "int8", error_feedback=True)`` is a DDP communication hook that
all-reduces gradient buckets with mpicoll's wire compression (``mpicoll.torch.hooks``).
"""

from __future__ import annotations

from .backend import NAME, Options, ProcessGroupMpicoll, Work, register
from .hooks import compress_hook
from .rendezvous import install as _install_rendezvous

__all__ = ["NAME", "Options", "ProcessGroupMpicoll", "Work", "compress_hook", "register"]

register()
_install_rendezvous()
