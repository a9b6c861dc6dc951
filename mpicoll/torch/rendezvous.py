"""Ranks from MPI for ``init_process_group``: no ``MASTER_ADDR`` under ``mpiexec`` or ``srun``.

``init_process_group`` without ``init_method`` rendezvouses through ``env://``: it reads
``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR`` and ``MASTER_PORT`` and builds a ``TCPStore``. After
``import mpicoll.torch``:

* ``MASTER_ADDR`` set and a rank given (``RANK`` in the environment, as ``torchrun`` sets it,
  or ``init_process_group(rank=...)``): torch's own ``env://``, unchanged;
* otherwise (a cluster may export ``MASTER_ADDR`` to every job; without a rank torch's
  ``env://`` would fail): MPI starts (``mpi4py``), the rank and size are ``COMM_WORLD``'s, and
  the store is a ``TCPStore`` that rank 0 serves on a port the kernel picks, whose address
  reaches the others through ``MPI_Bcast``: ``127.0.0.1`` when every rank shares rank 0's node
  (loopback only), else rank 0's host name. A ``rank=`` / ``world_size=`` that disagrees with
  MPI's raises ``ValueError``.

``init_method="mpi://"`` always takes the second path. mpicoll's collectives never use the
store (they run over MPI); torch keeps it for what it does outside the collectives
(``new_group``'s bookkeeping, ``monitored_barrier``, a Gloo group beside the mpicoll one).

Wrapping ``env://`` replaces the entry in ``torch.distributed.rendezvous``'s handler table
(``_rendezvous_handlers``, private): ``register_rendezvous_handler`` refuses a scheme that
exists. The wrapper hands every call with ``MASTER_ADDR`` and a rank to torch's handler
untouched.
"""

from __future__ import annotations

import os
import socket
from importlib import import_module
from datetime import timedelta
from urllib.parse import parse_qs, urlparse

from mpi4py import MPI
from torch.distributed import TCPStore

# the module torch.distributed.rendezvous (an import by that name gives torch's function)
rdzv = import_module("torch.distributed.rendezvous")

__all__ = ["install", "mpi_rendezvous", "store_from_mpi"]


def store_from_mpi(comm=None, timeout: timedelta = timedelta(minutes=30)):
    """A ``TCPStore`` shared by the ranks of ``comm`` (default ``COMM_WORLD``): rank 0 serves
    it on a free port, the others learn the address through MPI. Collective over ``comm``."""
    comm = MPI.COMM_WORLD if comm is None else comm
    rank, size = comm.Get_rank(), comm.Get_size()
    node = comm.Split_type(MPI.COMM_TYPE_SHARED, key=rank)
    one_node = comm.allreduce(node.Get_size() == size, op=MPI.LAND)
    node.Free()
    store, answer = None, None
    if rank == 0:
        host = "127.0.0.1" if one_node else socket.gethostname()
        try:
            store = TCPStore(host, 0, size, is_master=True, timeout=timeout,
                             wait_for_workers=False)
            answer = (host, store.port, None)
        except Exception as exc:            # the others must not wait for an address forever
            answer = (host, 0, f"{type(exc).__name__}: {exc}")
    host, port, error = comm.bcast(answer, root=0)
    if error is not None:
        raise RuntimeError(f"mpicoll.torch: rank 0 could not serve the TCPStore on {host}: "
                           f"{error}")
    if rank != 0:
        store = TCPStore(host, port, size, is_master=False, timeout=timeout)
    return store


def mpi_rendezvous(url: str, timeout: timedelta = timedelta(minutes=30), **kwargs):
    """The ``mpi://`` rendezvous: ``(store, rank, world_size)`` from ``COMM_WORLD``."""
    world = MPI.COMM_WORLD
    query = {k: v[-1] for k, v in parse_qs(urlparse(url).query).items()}
    for name, mpi_value in (("rank", world.Get_rank()), ("world_size", world.Get_size())):
        given = int(query.get(name, -1))
        if given not in (-1, mpi_value):
            raise ValueError(f"init_process_group({name}={given}), but MPI says {mpi_value} "
                             f"(COMM_WORLD of {world.Get_size()} ranks): under mpiexec/srun "
                             f"leave {name} out, or set MASTER_ADDR to use torch's env://")
    yield store_from_mpi(world, timeout), world.Get_rank(), world.Get_size()
    raise RuntimeError("mpi:// rendezvous cannot re-rendezvous (the MPI job is fixed)")


def install() -> None:
    """Register ``mpi://`` and wrap ``env://`` (once; see the module's doc)."""
    handlers = rdzv._rendezvous_handlers
    if "mpi" not in handlers:
        rdzv.register_rendezvous_handler("mpi", mpi_rendezvous)
    env = handlers.get("env")
    if env is None or getattr(env, "_mpicoll_wrapped", False):
        return

    def env_or_mpi(url, timeout=timedelta(minutes=30), **kwargs):
        ranked = "RANK" in os.environ or "rank" in parse_qs(urlparse(url).query)
        if os.environ.get("MASTER_ADDR") and ranked:
            return env(url, timeout=timeout, **kwargs)
        return mpi_rendezvous(url, timeout=timeout, **kwargs)

    env_or_mpi._mpicoll_wrapped = True
    env_or_mpi.__doc__ = ("torch's env:// when MASTER_ADDR and a rank are set, else mpi:// "
                          "(mpicoll.torch)")
    handlers["env"] = env_or_mpi
