"""On a shaped fabric (``bash slurm/local-cluster.sh up --fabric FILE``, docs/fabric.md): the
nodes' MPI traffic really crosses their veth links.

tests/run-slurm.sh runs this file on its own, on a cluster it starts with ``up --fabric
slurm/local/fabric-1g.json --nodes 2`` after the other Slurm tests. The cluster's export line sets
MPICOLL_FABRIC; without it (a cluster without a fabric: no netns capability, or a site's) the
test is skipped, and its job is not submitted.
"""

import json
import os

import pytest

FABRIC = os.environ.get("MPICOLL_FABRIC")

pytestmark = (pytest.mark.slurm_job("fabric_bytes") if FABRIC else
              pytest.mark.skip(reason="not on a shaped fabric (MPICOLL_FABRIC unset: the cluster "
                                      "is not one of `local-cluster.sh up --fabric`)"))


def test_traffic_crosses_the_node_links(job):
    assert job.rc == 0, job.explain()
    res = json.loads((job.results() / "fabric_bytes.json").read_text())
    assert res["shaped"], job.explain()               # one host name and one eth0 per node
    assert res["fabric"] == FABRIC and res["ucx_tls"] == "tcp,self"
    assert (res["nranks"], len(res["nodes"])) == (4, 2)
    assert len(set(res["hosts"])) == 2
    by_algo = {r["algorithm"]: r for r in res["records"]}
    assert set(by_algo) == {"ring", "hierarchical", "mpi"}
    for algo in ("ring", "hierarchical"):
        r = by_algo[algo]
        assert r["wrong"] == 0 and r["checked"], r
        # a ring of 4 ranks on 2 nodes sends 1.5 x 1 MiB per call out of each node
        assert r["counted_internode_bytes"] >= 2 * 2**20, r
        assert abs(r["link_tx_bytes"] / r["counted_internode_bytes"] - 1) <= 0.10, r
    # MPI_Allreduce crosses the links too (its own bytes: no count to hold it to)
    assert by_algo["mpi"]["link_tx_bytes"] >= 0.9 * by_algo["mpi"]["reference_bytes"]
