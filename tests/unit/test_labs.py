"""The labs (jobs/labs/lab_*.py) print what the seeds claim, and docs/labs.md quotes their output.

The MPI-measured lab (lab_bytes) is run under mpiexec by tests/jobs/test_cli_jobs.py; here its
in-process counts and its quiz arithmetic.
"""

import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
LABS = ROOT / "jobs" / "labs"
sys.path.insert(0, str(ROOT / "docs" / "generators"))   # what writes docs/labs.md

import labs_md  # noqa: E402

from mpicoll.tools import trace  # noqa: E402

# The seed's printed output of `python3 ring_ar.py demo` (seed 000, Lab 1): the reference.
SEED_RING_DEMO = """\
ring all-reduce, N=4: data=32B = 4 chunks x 8B
  RS0: G0->G1 c3=1  G1->G2 c0=2  G2->G3 c1=3  G3->G0 c2=4
  RS1: G0->G1 c2=5  G1->G2 c3=3  G2->G3 c0=5  G3->G0 c1=7
  RS2: G0->G1 c1=8  G1->G2 c2=7  G2->G3 c3=6  G3->G0 c0=9
  -> GPU i owns the FULL sum of chunk i: [10, 10, 10, 10]
  AG0: G0->G1 c0=10  G1->G2 c1=10  G2->G3 c2=10  G3->G0 c3=10
  AG1: G0->G1 c3=10  G1->G2 c0=10  G2->G3 c1=10  G3->G0 c2=10
  AG2: G0->G1 c2=10  G1->G2 c3=10  G2->G3 c0=10  G3->G0 c1=10
  -> the total everywhere: True; steps = 6; bytes/link = 48 (theory 2(N-1)/N*D = 48)
"""


def run(*args, timeout=120):
    proc = subprocess.run([sys.executable, *map(str, args)], cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout,
                          env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout


def last_line(out: str, lab: str) -> str:
    line = out.rstrip("\n").splitlines()[-1]
    assert line.startswith(f"{lab}: seed ") and " | ours " in line, line
    return line


# ----------------------------------------------------------------------------- lab 1: ring trace

@pytest.mark.timeout(60)
def test_trace_values_is_the_seeds_demo_line_for_line():
    out = run("-m", "mpicoll", "trace", "ring", "-N", "4", "--values")
    assert out.splitlines() == SEED_RING_DEMO.splitlines()
    assert trace.render_values(4) == SEED_RING_DEMO


@pytest.mark.parametrize("n", [1, 2, 3, 5, 8, 13])
def test_trace_values_any_n(n):
    lines = trace.render_values(n).splitlines()
    total = n * (n + 1) // 2
    assert lines[0] == f"ring all-reduce, N={n}: data={8 * n}B = {n} chunks x 8B"
    steps = [line for line in lines if line.startswith(("  RS", "  AG"))]
    assert [s.split(":")[0].strip() for s in steps] == \
        [f"RS{t}" for t in range(n - 1)] + [f"AG{t}" for t in range(n - 1)]
    for t, step in enumerate(steps[:n - 1]):      # reduce-scatter: GPU i sends chunk i-1-t
        msgs = step.split(": ", 1)[1].split("  ")
        assert [m.split("=")[0] for m in msgs] == \
            [f"G{i}->G{(i + 1) % n} c{(i - 1 - t) % n}" for i in range(n)]
    assert f"FULL sum of chunk i: [{', '.join([str(total)] * n)}]" in lines[n]
    assert lines[-1] == (f"  -> the total everywhere: True; steps = {2 * (n - 1)}; bytes/link = "
                         f"{16 * (n - 1)} (theory 2(N-1)/N*D = {16 * (n - 1)})")


def test_trace_values_refuses_other_algorithms_and_empty_rings(capsys):
    for argv, says in ((["recursive_doubling", "--values"], "ring all-reduce only"),
                       (["ring", "-N", "0", "--values"], "must be a positive integer, got '0'")):
        with pytest.raises(SystemExit) as exit:
            trace.main(argv)
        err = capsys.readouterr().err
        assert exit.value.code == 2 and says in err and len(err.splitlines()) == 1, err


@pytest.mark.timeout(60)
def test_lab_ring_trace(tmp_path):
    out = run(LABS / "lab_ring_trace.py", "--json", tmp_path / "r.json", "--sweep", "9")
    assert "9/9 lines as the seed's demo" in last_line(out, "lab_ring_trace")
    res = json.loads((tmp_path / "r.json").read_text())
    assert res["identical_lines"] == 9
    assert all(r["bytes_per_link"] == r["theory"] == 2 * (r["N"] - 1) * 8 for r in res["sweep"])


# ----------------------------------------------------------------------------- lab 7: checkpoint

@pytest.mark.timeout(60)
def test_lab_checkpoint(tmp_path):
    out = run(LABS / "lab_checkpoint.py", "--json", tmp_path / "c.json")
    line = last_line(out, "lab_checkpoint")
    assert "ours 13.7 failures/day, T* = 29.0 min" in line
    assert "one failure every 105 min" in out
    res = json.loads((tmp_path / "c.json").read_text())
    seed_rows = {r["T"]: r for r in res["rows"] if r["seed"] is not None}
    assert set(seed_rows) == {300, 1800, 7200}
    for r in seed_rows.values():                  # the seed's rows, to its two decimals
        assert round(r["first_order"] * 100, 2) == pytest.approx(r["seed"] * 100)
    assert abs(res["monte_carlo_min_s"] / res["T_star_s"] - 1) <= 0.15
    assert res["daly_s"] / 60 == pytest.approx(26.4, abs=0.05)
    for r in res["rows"]:                         # the simulation follows Daly's exact form
        assert r["monte_carlo"] == pytest.approx(r["exact"], rel=0.02)
    q = res["quiz4"]
    lam = 40_000 / (4 * 365 * 86400)
    assert q["failures_per_day"] == pytest.approx(lam * 86400)
    assert q["T_star_s"] == pytest.approx(math.sqrt(2 * 180 / lam))
    assert q["lost_wall_per_failure_s"] == pytest.approx(q["T_star_s"] / 2 + 1200)


# ----------------------------------------------------------------------------- lab_bytes (no MPI)

@pytest.fixture(scope="module")
def lab_bytes_today(tmp_path_factory):
    """``python jobs/labs/lab_bytes.py --json``, no MPI job: every N from the in-process
    executor. (Under mpiexec: tests/jobs/test_cli_jobs.py.)"""
    path = tmp_path_factory.mktemp("lab_bytes") / "b.json"
    out = run(LABS / "lab_bytes.py", "--json", path)
    assert "(in-process executor, no MPI job)" in last_line(out, "lab_bytes")
    return json.loads(path.read_text())


@pytest.mark.timeout(120)
def test_lab_bytes_inprocess_counts_and_quiz(lab_bytes_today):
    V = lab_bytes_today["V"]
    rows = {r["N"]: r for r in lab_bytes_today["rows"]}
    assert sorted(rows) == list(range(2, 9))
    for n, row in rows.items():
        per_rank = [{k: tuple(v) for k, v in r.items()} for r in row["per_rank"]]
        assert row["source"] == "in-process" and len(per_rank) == n
        assert {r["ring"][0] for r in per_rank} == {2 * (n - 1) * V // n}
        assert {r["naive"] for r in per_rank} == {((n - 1) * V, (n - 1) * V)}
        assert per_rank[0]["star"] == ((n - 1) * V, (n - 1) * V)
        assert {r["star"] for r in per_rank[1:]} == {(V, V)}
    quiz = {q["N"]: q for q in lab_bytes_today["quiz3"]}
    q8, q16 = quiz[8], quiz[16]
    G = 1 << 30
    assert q8["ring_steps"] == 14 and q8["ring_bytes_per_link"] == 2 * 7 * G // 8
    assert q8["ring_s"] == pytest.approx(14 * 2e-6 + 2 * 7 / 8 * G / 25e9)
    assert q8["star_s"] == pytest.approx(2 * (2e-6 + 7 * G / 50e9))
    assert q16["star_s"] / q8["star_s"] == pytest.approx(15 / 7, rel=1e-4)   # N doubles: ~2x


# ----------------------------------------------------------------------------- lab 9: sockets

@pytest.mark.timeout(120)
def test_lab_sockets(tmp_path):
    out = run(LABS / "lab_sockets.py", "--world", "3", "--count", "3001", "--hang-seconds", "1.5",
              "--timeout", "0.5", "--json", tmp_path / "s.json")
    last_line(out, "lab_sockets")
    res = json.loads((tmp_path / "s.json").read_text())
    assert res["correct"]
    V = 3001 * 8
    ring = res["algorithms"]["ring"]["bytes_sent_per_rank"]
    assert sum(ring) == 3 * 2 * 2 * V // 3        # 2(N-1)/N.V per rank, uneven blocks in all
    assert res["algorithms"]["naive"]["bytes_sent_per_rank"] == [2 * V] * 3
    assert res["freeze_no_timeout"]["hung_ranks"] == [0, 1]
    assert res["freeze_timeout"]["culprits"] == [2]
    assert any(r["error"] == "PeerTimeout" and r["peers"] == [2]
               for r in res["freeze_timeout"]["reports"])
    assert res["kill"]["named"] == [2] and res["kill"]["hung_ranks"] == []


def test_socket_executor_names_a_wrong_length():
    """A schedule mismatch raises on the rank that sees it, naming the peer."""
    import multiprocessing as mp

    from mpicoll.executors.sockets import PeerFault, SocketComm, execute, open_listeners
    from mpicoll.schedule import Recv, Send, make_schedule

    listeners, ports = open_listeners(2)
    ctx = mp.get_context("fork")

    def sender():
        comm = SocketComm.connect(1, 2, listeners[1], ports)
        execute(make_schedule([[Send(0, 0, 3)]]), np.ones(3), comm, timeout=5)
        comm.close()

    p = ctx.Process(target=sender)
    p.start()
    comm = SocketComm.connect(0, 2, listeners[0], ports)
    with pytest.raises(PeerFault, match="rank 1 sent 24 bytes, the schedule expects 16"):
        execute(make_schedule([[Recv(1, 0, 2, reduce=False)]]), np.zeros(2), comm, timeout=5)
    comm.close()
    p.join(10)


# ----------------------------------------------------------------------------- lab 2: crossover

@pytest.mark.timeout(120)
def test_lab_crossover(tmp_path):
    out = run(LABS / "lab_crossover.py", "--json", tmp_path / "x.json")
    assert "ours ring latency 28 us" in last_line(out, "lab_crossover")
    res = json.loads((tmp_path / "x.json").read_text())
    assert all(t["latency_s"] == pytest.approx(28e-6) for t in res["ring_terms"])
    assert 400_000 <= res["terms_equal"] <= 400_000 * 1.02 ** 2   # N.L.B, on a 2 % grid
    assert 440_000 / 1.02 ** 2 <= res["crossover_fine"] <= 440_000 * 1.02 ** 2   # 8.8 L.B
    ring, rd = res["times_s"]["ring"], res["times_s"]["recursive_doubling"]
    assert rd[0] < ring[0] and ring[-1] < rd[-1]                 # trees below, rings above


# ----------------------------------------------------------------------------- lab 4: rails

@pytest.mark.timeout(120)
def test_lab_rails(tmp_path):
    out = run(LABS / "lab_rails.py", "--json", tmp_path / "r.json")
    assert "ours 2 vs 0 cross-rail hops, 5 vs 50 GB/s" in last_line(out, "lab_rails")
    res = json.loads((tmp_path / "r.json").read_text())
    rank, rail = res["orders"]["rank"], res["orders"]["rail"]
    assert rank["ring"] == list(range(16))
    assert rail["ring"] == list(range(8)) + list(range(15, 7, -1))
    assert (rank["cross_rail_hops"], rail["cross_rail_hops"]) == (2, 0)
    assert 8 <= res["ratio"] <= 12                               # issue 11's done-means
    assert res["sweep"][0]["ratio"] < 1.1 < 9 < res["sweep"][-1]["ratio"]


# ----------------------------------------------------------------------------- lab 5: placement

@pytest.mark.timeout(120)
def test_lab_placement_small(tmp_path):
    out = run(LABS / "lab_placement.py", "--max-nodes", "8", "--json", tmp_path / "p.json")
    line = last_line(out, "lab_placement")
    assert "ours TP 16 MiB 6.2x slower across 8 nodes (transfer 9.0x" in line
    assert "bubble 27.3% counted = 3/11; a dead node takes out 32 vs 256 GPUs" in line
    res = json.loads((tmp_path / "p.json").read_text())
    tp = res["tp"]
    assert tp["activation_bytes"] == 2048 * 2048 * 4 and tp["bw_ratio"] == 9
    assert tp["transfer_ratio"] == pytest.approx(9.0)          # the NVLink/NIC ratio, exactly
    assert 5 < tp["ratio"] < 9 and tp["two_nodes_ratio"] >= tp["ratio"] * 0.95
    ratios = [s["ratio"] for s in tp["sweep"]]
    assert ratios == sorted(ratios) and ratios[0] == pytest.approx(2.5, rel=0.01)   # 5 us / 2 us
    assert all(s["transfer_ratio"] == pytest.approx(9.0) for s in tp["sweep"])
    for r in res["hierarchical"]["rows"]:
        assert r["ring_steps"] == 2 * (r["ranks"] - 1)
        if r["nodes"] == 1:                     # one node: both are the ring inside it
            assert r["win"] == pytest.approx(1.0)
        else:
            assert r["win"] > 2
    assert {s["wins_from_nodes"] for s in res["hierarchical"]["summary"]} == {2}
    assert res["bubble"]["max_abs_difference"] < 1e-12
    assert res["bubble"]["seed_case"]["count"] == pytest.approx(3 / 11)
    rows = {(r["failure"], r["placement"]): r for r in res["blast"]["rows"]}
    assert rows["one node", "tp-inside"]["stalled_replica_ranks"] == 32
    assert rows["one node", "tp-across"]["stalled_replica_ranks"] == 256
    assert rows["one GPU", "tp-inside"]["stalled_tp_ranks"] == 8
    assert rows["one GPU", "tp-across"]["stalled_replica_ranks"] == 32
    assert len({r["restart_gpu_s"] for r in rows.values()}) == 1     # placement-free
    assert res["blast"]["replicas_hit_by_node"] == {"tp-inside": [1], "tp-across": [8]}
    recorded = json.loads((RECORDED / "lab_placement.json").read_text())
    small = [r for r in recorded["hierarchical"]["rows"] if r["nodes"] <= 8]
    assert small == res["hierarchical"]["rows"], "docs/labs/lab_placement.json is stale"


# ----------------------------------------------------------------------------- lab 6: straggler

@pytest.mark.timeout(120)
def test_lab_straggler_small(tmp_path):
    out = run(LABS / "lab_straggler.py", "--samples", "30", "--max-n", "512", "--json",
              tmp_path / "s.json")
    assert "ours 25 per step, P(none) = 1.4e-11" in last_line(out, "lab_straggler")
    res = json.loads((tmp_path / "s.json").read_text())
    assert res["n25000"]["p_none"] == pytest.approx(math.exp(25_000 * math.log(0.999)))
    for r in res["rows"]:
        assert r["p50_s"] >= r["base_s"] and r["p99_s"] <= r["base_s"] + 0.1 + 1e-9
        assert r["analytic"] == pytest.approx(1 - 0.999 ** r["N"])


def test_recorded_lab_straggler_reaches_the_tail():
    """The recorded full run (70 s, not rerun here): the fleet median is the straggler's."""
    res = json.loads((RECORDED / "lab_straggler.json").read_text())
    small, big = res["rows"][0], res["rows"][-1]
    assert big["N"] == 24576 and big["with_straggler"] == 1.0
    assert small["p50_s"] == pytest.approx(small["base_s"])
    assert big["p50_s"] == pytest.approx(big["base_s"] + res["compute_s"], rel=0.01)


# ----------------------------------------------------------------------------- lab 8: ladder

@pytest.mark.timeout(180)
def test_lab_ladder_runs(tmp_path):
    out = run(LABS / "lab_ladder.py", "--iters", "200", "--nagle-iters", "2", "--json",
              tmp_path / "l.json", timeout=170)
    line = last_line(out, "lab_ladder")
    assert "seed ~17 us TCP vs ~0.6 us shared memory" in line
    rungs = json.loads((tmp_path / "l.json").read_text())["seconds_per_round_trip"]
    assert len(rungs) == 7 and all(0 < t < 1 for t in rungs.values())
    # Nagle: two writes per message wait for a delayed ACK (Linux: >= 4 ms)
    assert rungs["TCP, no NODELAY, 4+4-byte writes"] > 10 * rungs["TCP 127.0.0.1, TCP_NODELAY"]


# ----------------------------------------------------------------------------- docs/labs.md

LABS_MD = ROOT / "docs/labs.md"
RECORDED = ROOT / "docs/labs"


def test_labs_md_blocks_are_current():
    text = LABS_MD.read_text()
    names = [m["name"] for m in labs_md.BLOCK.finditer(text)]
    assert {"trace_values", "lab_ring_trace", "lab_bytes", "lab_checkpoint", "lab_crossover",
            "lab_rails", "lab_straggler", "lab_ladder", "lab_sockets",
            "lab_placement"} <= set(names)
    assert labs_md.fill(text, RECORDED) == text, "stale docs/labs.md: run bash docs/make-labs.sh"


@pytest.mark.timeout(60)
@pytest.mark.parametrize("name, args", [
    ("trace_values", ["-m", "mpicoll", "trace", "ring", "-N", "4", "--values"]),
    ("lab_ring_trace", [LABS / "lab_ring_trace.py"]),
    ("lab_checkpoint", [LABS / "lab_checkpoint.py"]),
    ("lab_rails", [LABS / "lab_rails.py"]),
    ("lab_crossover", [LABS / "lab_crossover.py"]),
])
def test_recorded_output_is_what_the_code_prints_today(name, args):
    """Labs whose output does not depend on timing: the recorded output must be today's
    (lab_crossover's measured line, from --measure, aside)."""
    def simulated(text):
        return re.sub(r"; this machine \(N=\d+\) measured: .*", "", "".join(
            line for line in text.splitlines(keepends=True)
            if not line.startswith("this machine (")))

    assert run(*args) == simulated(labs_md.recorded(RECORDED, name)), \
        f"docs/labs/{name}.txt is stale: run bash docs/make-labs.sh"


@pytest.mark.timeout(120)
def test_recorded_lab_bytes_matches_todays_counts(lab_bytes_today):
    res = json.loads((RECORDED / "lab_bytes.json").read_text())
    assert res["V"] == lab_bytes_today["V"]
    today = {r["N"]: r["per_rank"] for r in lab_bytes_today["rows"]}
    for row in res["rows"]:
        assert today[row["N"]] == row["per_rank"], row["N"]
        if row["source"] == "MPI":
            assert row["mpi_equals_inprocess"], f"N={row['N']}: MPI counted other bytes"
    assert res["quiz3"] == lab_bytes_today["quiz3"]


@pytest.mark.timeout(120)
def test_lab_elastic_arithmetic(tmp_path):
    """lab_elastic: the seed's 13.7/day, 29.0 min and 41.87 % first, then goodput rows whose
    arithmetic is recomputed here: 1/(1 + Daly's exact overhead) at the best interval, times
    the training share (shrink: nodes missing during repairs; spares: idle spare nodes)."""
    out = run(LABS / "lab_elastic.py", "--json", tmp_path / "e.json")
    assert "13.7 failures/day" in out and "T* = sqrt(2W/lambda) = 29.0 min" in out
    assert "at T = 30 min: 41.87 %" in out
    data = json.loads((tmp_path / "e.json").read_text())
    lam = 25_000 / (5.0 * 365 * 86400)                     # failures/s: 25,000 GPUs, MTBF 5 y

    def daly(T, W, R):          # Daly's complete expected overhead, exponential failures
        M = 1 / lam
        return math.exp(R / M) * math.expm1((T + W) / M) * M / T - 1

    assert math.isclose(data["failures_per_day"], 13.7, abs_tol=0.05)
    rows = {r["strategy"]: r for r in data["rows"]}
    restart, shrink, spares = (rows[k] for k in ("checkpoint-restart", "in-place shrink",
                                                 "hot spares"))
    assert (restart["W_s"], restart["R_s"]) == (240.0, 900.0)
    for r in data["rows"]:
        overhead = daly(r["T_s"], r["W_s"], r["R_s"])
        assert math.isclose(r["overhead"], overhead, rel_tol=1e-9)
        assert math.isclose(r["goodput"], r["training_share"] / (1 + overhead), rel_tol=1e-12)
        for T in (r["T_s"] * 0.8, r["T_s"] * 1.25):        # a minimum: worse on either side
            assert daly(T, r["W_s"], r["R_s"]) > overhead
    broadcast = 500e9 * 16 / 25_000 / 50e9                  # 320 MB per GPU at 50 GB/s
    assert math.isclose(shrink["R_s"], 1.08 + broadcast) and \
        math.isclose(spares["R_s"], 1.31 + broadcast)
    assert math.isclose(shrink["training_share"], 1 - lam * 86400 * 8 / 25_000)
    # the Poisson quantile: P(X <= S) >= 0.999 > P(X <= S - 1), mean lambda.H = 13.7
    mean = lam * 86400
    cdf = lambda k: sum(math.exp(-mean) * mean ** i / math.factorial(i) for i in range(k + 1))
    assert cdf(spares["spare_nodes"]) >= 0.999 > cdf(spares["spare_nodes"] - 1)
    assert math.isclose(spares["training_share"], 25_000 / (25_000 + 8 * spares["spare_nodes"]))
    assert restart["goodput"] < spares["goodput"] < shrink["goodput"]
