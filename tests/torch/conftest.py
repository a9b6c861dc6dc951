"""The PyTorch backend's tests (``mpicoll.torch``), in the torch environment (``.venv-torch``,
``pip install -e '.[mpich,test,torch]'``; tests/run-torch.sh runs them):

    mpiexec -n N python -m mpi4py -m pytest tests/torch/test_backend.py --with-mpi  # N = 2, 4
    python -m pytest tests/torch/test_jobs.py                                       # serial

Under mpiexec the session initialises the default group on "mpicoll" once (ranks from MPI: no
MASTER_ADDR) and a Gloo group beside it, over the store mpicoll.torch set up. Assertions that
can differ across ranks go through ``mpicoll.testing.agree`` so every rank fails together.
"""

import os
from datetime import timedelta

import pytest

try:
    import torch  # noqa: F401
except ImportError:                 # the main environment: nothing here to collect
    collect_ignore_glob = ["*.py"]


def pytest_configure(config):
    if "OMPI_COMM_WORLD_RANK" in os.environ or "PMI_RANK" in os.environ:
        from mpi4py import MPI
        if MPI.COMM_WORLD.Get_rank() != 0:
            config.option.verbose = -2
            config.option.tbstyle = "line"


@pytest.fixture(scope="session")
def world():
    """The default process group on "mpicoll" (60 s timeout), and COMM_WORLD."""
    import torch
    import torch.distributed as dist
    from mpi4py import MPI
    import mpicoll.torch  # noqa: F401 -- registers the backend
    torch.set_num_threads(1)
    os.environ.pop("MASTER_ADDR", None)
    dist.init_process_group("mpicoll", timeout=timedelta(seconds=60))
    yield MPI.COMM_WORLD
    dist.destroy_process_group()


@pytest.fixture(scope="session")
def gloo(world):
    import torch.distributed as dist
    return dist.new_group(backend="gloo")
