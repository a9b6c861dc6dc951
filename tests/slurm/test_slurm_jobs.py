"""The slurm/*.sbatch scripts, submitted for real (see conftest.py for the jobs and options)."""

import json
from pathlib import Path

import pytest

from mpicoll.registry import ALLREDUCE

SUBMIT_DIR = Path(__file__).resolve().parents[2] / "results" / "slurm-tests"   # conftest.BASE


def load(path):
    return json.loads(path.read_text())


def assert_ok(job):
    assert job.rc == 0, job.explain()
    assert "finished with status 0" in job.log(), job.explain()


def assert_two_nodes(res, job):
    """4 ranks on the 2 nodes MPI's COMM_TYPE_SHARED reports, with no override."""
    assert (res["nranks"], res["nodes"], res["ranks_per_node"]) == (4, 2, 2), job.explain()
    assert res["virtual_nodes"] is None
    assert res["slurm_job_id"] == job.id


@pytest.mark.slurm_job("bench")
def test_bench_all_algorithms_on_two_nodes(job):
    assert_ok(job)
    out = job.results()
    assert out.name == f"mpicoll-bench-{job.id}"            # <job name>-<job id>
    assert out.parent == SUBMIT_DIR / "results"              # default: results/ where submitted
    res = load(out / "bench-allreduce.json")
    assert_two_nodes(res, job)
    assert {r["algorithm"] for r in res["records"]} == {  # bench skips shm across nodes
        a for a, algo in ALLREDUCE.items() if not algo.has("shared-memory")} | {"auto"}
    assert {r["size"] for r in res["records"]} == {8, 64, 512, 4096}
    assert [r for r in res["records"] if r["wrong"]] == []
    assert (out / "bench-allreduce.png").stat().st_size > 10_000
    info = load(out / "job.json")
    assert info["launcher"] in ("srun --mpi=pmi2", "srun --mpi=pmix")
    assert (info["job_id"], info["nodes"], info["ntasks"]) == (job.id, 2, 4)


@pytest.mark.slurm_job("hierarchical")
def test_hierarchical_finds_two_nodes_and_is_right(job):
    assert_ok(job)
    out = job.results()
    res = load(out / "hierarchical_vs_flat.json")
    assert_two_nodes(res, job)
    hier = [r for r in res["records"] if r["algorithm"] == "hierarchical"]
    assert hier and all(r["wrong"] == 0 for r in res["records"])
    assert [c["size"] for c in res["comparison"]] == [8, 64, 512, 4096]
    assert all(c["speedup"] > 0 and c["best_flat"] in res["flat_algorithms"]
               for c in res["comparison"])
    for png in ("hierarchical_vs_flat.png", "hierarchical_speedup.png"):
        assert (out / png).stat().st_size > 10_000
    assert "NOTE: one node" not in job.log()


@pytest.mark.slurm_job("sweep")
def test_sweep_array_one_result_per_index(job):
    # sbatch --wait's exit status covers every task only while slurmctld remembers them all
    # (MinJobAge); each task's own log and results are the real evidence.
    assert job.rc == 0, job.explain()
    entries = ["-m 8:32", "-m 256:1K", "ranks=1 -m 8:8"]
    expect = [(2, {8, 32}), (2, {256, 1024}), (1, {8})]
    for index, (entry, (nranks, sizes)) in enumerate(zip(entries, expect)):
        log = job.log(index)
        assert "finished with status 0" in log, log[-3000:]
        out = job.results(index)
        assert out.name == f"mpicoll-sweep-{job.id}_{index}"   # <name>-<array id>_<index>
        assert (out / "sweep-entry.txt").read_text().strip() == entry
        res = load(out / "bench-allreduce.json")
        assert res["nranks"] == nranks
        assert {r["size"] for r in res["records"]} == sizes
        assert all(r["wrong"] == 0 for r in res["records"])
        assert (out / "bench-allreduce.png").exists()
    assert not list(job.results(0).parent.glob(f"mpicoll-sweep-{job.id}_3"))


@pytest.mark.slurm_job("tests")
def test_mpi_test_suite_across_ranks(job):
    assert_ok(job)
    runs = load(job.results() / "tests.json")
    assert [r["nranks"] for r in runs] == [4]
    for r in runs:
        assert r["exit"] == 0 and r["failed"] == 0 and r["passed"] > 0, runs


@pytest.mark.slurm_job("fault_matrix")
def test_fault_matrix_across_nodes(job):
    """Issue #22's matrix at N = 4 on two nodes, once: every case of every algorithm and form
    ends as promised on every rank (no FAIL, no hang: the job would have aborted), and the
    shared-memory algorithms, which refuse ranks on two nodes, are left out as the job says."""
    assert_ok(job)
    res = load(job.results() / "fault_matrix.json")
    rows = res["rows"]
    assert rows and {len(r["ranks"]) for r in rows} == {4}, job.explain()
    assert {"local error", "count mismatch", "skipped call then another", "root=self bcast",
            "Free in flight", "threads"} <= {r["case"] for r in rows}
    assert "shm" not in {r["algorithm"] for r in rows}
    for row in rows:
        assert not row["verdict"].startswith("FAIL"), row
        if row["owner"] is None:
            assert row["verdict"] == "ok", row


@pytest.mark.slurm_job("deaths")
def test_a_node_dies(job):
    """Issue 41 across the two nodes: node 2's ranks (2, 3) are SIGKILLed mid-loop; ranks 0 and
    1 raise ProcessFailed naming exactly [2, 3] within seconds (heartbeats: the job sets
    MPICOLL_HEARTBEAT_ONLY=1), shrink to 2 ranks and compute right with every algorithm."""
    assert_ok(job)
    folder = job.results() / "deaths"
    rows = {r: load(folder / f"rank{r}.json") for r in range(4)
            if (folder / f"rank{r}.json").exists()}
    assert set(rows) == {0, 1, 2, 3}, (rows, job.explain())
    for r in (2, 3):
        assert rows[r].get("victim"), rows
    for r in (0, 1):
        row = rows[r]
        assert row.get("error") == "ProcessFailed", (row, job.explain())
        assert set(row["ranks"]) <= {2, 3} and row["detect"] < 3.5, row
        assert row["size"] == 2 and all(row["checks"].values()), row
        assert row["again"] == "ProcessFailed" and row["free"] < 2.0, row


@pytest.mark.slurm_job("elastic")
def test_training_survives_a_node(job):
    """Issue 42 across the two nodes: train_dp.py --reproducible, 4 ranks; node 2's ranks (2, 3)
    die at step 37; ranks 0 and 1 shrink, restore the last commit and finish the 50 steps with
    the uninterrupted run's weights, bit for bit, within 5 s of the deaths (1.7-2.3 s measured)."""
    assert_ok(job)
    out = job.results()
    plain, killed = (load(out / run / "train_dp_elastic.json") for run in ("plain", "killed"))
    assert plain["ranks_end"] == 4 and killed["ranks_end"] == 2, (killed, job.explain())
    for r in (2, 3):
        assert (out / "killed" / f"killed.rank{r}.json").exists(), job.explain()
    for r in (0, 1):
        row = load(out / "killed" / f"train_dp_elastic.rank{r}.json")
        assert row["weights_sha256"] == plain["weights_sha256"], (row, plain)
        # both found by heartbeats within one timeout (1.5 s; rank 0 watches both) + the
        # recovery: 1.7-2.25 s measured at loads of 10-14 (docs/elastic.md). Issue 42 asks for
        # 3 s + the state's broadcast (9.8 kB: milliseconds), a target the benchmark keeps
        # (slurm/elastic.sbatch prints it); here 5 s, a margin for CI's load that still fails
        # the 10 s of two timeouts at 5 s. One timeout per node's deaths is held by
        # tests/jobs/test_deaths.py::test_two_deaths_found_by_heartbeats_within_one_timeout.
        assert len(row["recovery_seconds"]) == 1 and 0 < row["recovery_seconds"][0] < 5.0, row
    print("recovery across two nodes:", killed["recovery_seconds"], "s")


@pytest.mark.slurm_job("crossover")
def test_crossover_measured_and_modelled(job):
    assert_ok(job)
    out = job.results()
    res = load(out / "crossover.json")
    assert (res["nranks"], res["nodes"]) == (4, 2)
    assert res["link"] == "inter-node" and res["profile"]["alpha_inter"] > 0
    assert res["n_alpha_over_beta"] > 0
    assert res["sizes"] == [8, 64, 512, 4096, 32768, 65536]     # -e 64K: the end is measured
    for name in ("ring", "recursive_doubling", "binomial", "recursive_halving"):
        assert len(res["measured_us"][name]) == len(res["predicted_us"][name]) == 6
    assert "measured crossover:" in job.log()
    assert (out / "crossover.png").stat().st_size > 10_000
    bench = load(out / "crossover-bench.json")
    assert all(r["wrong"] == 0 for r in bench["records"])


@pytest.mark.slurm_job("scaling")
def test_scaling_in_n(job):
    assert_ok(job)
    res = load(job.results() / "scaling.json")
    assert res["nranks"] == [2, 3, 4]
    # ranks fill n1 first: N=2 stays on one node, 3 and 4 span both
    assert {(r["nranks"], r["nodes"]) for r in res["records"]} == {(2, 1), (3, 2), (4, 2)}
    assert {r["algorithm"] for r in res["records"]} == set(ALLREDUCE)
    assert all(r["wrong"] == 0 for r in res["records"])
    assert (job.results() / "scaling.png").exists()


@pytest.mark.slurm_job("ring_order")
def test_ring_order_cyclic_placement(job):
    """srun --distribution=cyclic on 2 nodes x 2: rank r on node r % 2, so every hop of the
    rank-order ring crosses nodes; the node- and rail-order rings cross at 2 of 4 hops, and the
    MPI executor's counters show half the bytes leaving the nodes."""
    assert_ok(job)
    res = load(job.results() / "ring_order.json")
    assert res["nranks"] == 4 and res["nodes"] == [[0, 2], [1, 3]], job.explain()
    where = res["slurm_nodes"]                       # SLURMD_NODENAME of each rank
    assert where[0] == where[2] != where[1] == where[3], where
    assert res["auto_order"] == "node"
    by = {(r["order"], r["count"]): r for r in res["records"]}
    assert {o for o, _ in by} == {"rank", "node", "rail"}
    for count in (1000, 100000):
        rank, node, rail = (by[(o, count)] for o in ("rank", "node", "rail"))
        assert all(r["wrong"] == 0 for r in (rank, node, rail))
        assert (rank["internode_hops"], node["internode_hops"], rail["internode_hops"]) == (4, 2, 2)
        assert rank["internode_bytes"] == rank["bytes_sent"] == 2 * 3 * 8 * count
        assert node["internode_bytes"] == rail["internode_bytes"] == rank["internode_bytes"] // 2
        for r in (rank, node, rail):          # the counters agree with the schedules
            assert r["internode_bytes"] == r["expected_internode_bytes"], r


@pytest.mark.slurm_job("mpiexec")
def test_mpiexec_fallback_with_named_environment(job):
    assert_ok(job)
    out = job.results()
    assert out.parent.name == "elsewhere"                     # MPICOLL_RESULTS
    info = load(out / "job.json")
    assert info["launcher"].endswith("/mpiexec")
    res = load(out / "bench-allreduce.json")
    assert_two_nodes(res, job)
    assert all(r["wrong"] == 0 for r in res["records"])


@pytest.mark.slurm_job("bad_python")
def test_missing_python_fails_fast_and_says_why(job):
    assert job.rc not in (0, None), job.explain()
    assert "MPICOLL_PYTHON=/nonexistent/bin/python not found" in job.log()
