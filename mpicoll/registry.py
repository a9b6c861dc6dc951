"""Every algorithm of every collective, with its restrictions: the one list the API, the tests,
the benchmark and the cost model iterate over. Adding an algorithm is one module plus one line.

``mpi`` stands for the MPI library's own collective (the reference); it has no schedule.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType

from .algorithms import (allgather_recursive_doubling, allgather_ring, allreduce_binomial,
                         allreduce_hierarchical, allreduce_recursive_doubling,
                         allreduce_recursive_halving, allreduce_ring, bcast_binomial,
                         bcast_scatter_ring_allgather, reduce_scatter_recursive_halving,
                         reduce_scatter_ring)

__all__ = ["Algorithm", "ALLREDUCE", "REDUCE_SCATTER_BLOCK", "ALLGATHER", "BCAST", "COLLECTIVES"]


@dataclass(frozen=True)
class Algorithm:
    name: str
    module: ModuleType | None     # None: the MPI library's own collective
    restrictions: str = "any size, any count"

    @property
    def schedule(self):
        return self.module.schedule

    @property
    def cost(self):
        return self.module.cost


def _table(*algorithms: Algorithm) -> dict[str, Algorithm]:
    return {a.name: a for a in algorithms}


ALLREDUCE = _table(
    Algorithm("ring", allreduce_ring),
    Algorithm("recursive_halving", allreduce_recursive_halving,
              "non-power-of-two sizes fold 2*rem ranks (whole vector)"),
    Algorithm("recursive_doubling", allreduce_recursive_doubling,
              "non-power-of-two sizes fold 2*rem ranks (whole vector)"),
    Algorithm("binomial", allreduce_binomial),
    Algorithm("hierarchical", allreduce_hierarchical,
              "needs node layout; inner ring/recursive_halving need equal ranks per node"),
    Algorithm("mpi", None, "the MPI library's MPI_Allreduce"),
)
REDUCE_SCATTER_BLOCK = _table(
    Algorithm("ring", reduce_scatter_ring),
    Algorithm("recursive_halving", reduce_scatter_recursive_halving,
              "non-power-of-two sizes fold 2*rem ranks (whole vector)"),
    Algorithm("mpi", None, "the MPI library's MPI_Reduce_scatter_block"),
)
ALLGATHER = _table(
    Algorithm("ring", allgather_ring),
    Algorithm("recursive_doubling", allgather_recursive_doubling,
              "non-power-of-two sizes fold 2*rem ranks"),
    Algorithm("mpi", None, "the MPI library's MPI_Allgather"),
)
BCAST = _table(
    Algorithm("binomial", bcast_binomial),
    Algorithm("ring", bcast_scatter_ring_allgather, "binomial scatter + ring all-gather"),
    Algorithm("mpi", None, "the MPI library's MPI_Bcast"),
)
COLLECTIVES = {
    "allreduce": ALLREDUCE,
    "reduce_scatter_block": REDUCE_SCATTER_BLOCK,
    "allgather": ALLGATHER,
    "bcast": BCAST,
}
