"""The warm-up guide's Lab 01 itself: the ring all-reduce over plain TCP sockets, no MPI.

    python jobs/labs/lab_sockets.py --world 4 [--count 100000] [--json FILE]

Seed 001 (Lab 01): run the ring all-reduce between processes over sockets, check the result,
measure that each rank moves about 2(N-1)/N.V (not the naive N.V); then the failure demo --
kill a rank, watch the others hang, add a timeout (chapter 8: synchronous collectives have the
property that one failure hangs everyone; a timeout turns the hang into an error naming the
culprit).

Here ``--world`` processes on 127.0.0.1 run mpicoll's own schedules (the ring, and every other
flat all-reduce of the registry) through ``mpicoll.executors.sockets``: the result is checked
against the exact sum and the bytes each rank sent are counted. Then the failure demo, three
runs of the ring with one rank (--victim, default the last) failing at the start of the call:

1. frozen (it stops itself with SIGSTOP: alive, connections open, silent -- a hung process or a
   node gone without closing its connections), no timeout: the other ranks block; the lab
   notices after --hang-seconds that none has finished, and kills the job (it does not wait
   forever);
2. frozen, with ``timeout``: every live rank raises ``PeerTimeout`` naming the rank(s) it waits
   for; the rank named that did not report itself is the dead one;
3. killed (SIGKILL: the kernel closes its connections): its neighbours raise ``PeerLost`` naming
   it at once, no timeout needed.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import time

import numpy as np
from lab_common import claim, parser, write_json

from mpicoll import kernels
from mpicoll.simulators import inprocess
from mpicoll.executors.sockets import PeerFault, SocketComm, execute, open_listeners
from mpicoll.registry import ALLREDUCE

FLAT = [name for name, a in ALLREDUCE.items()         # one-level algorithms: every rank alike
        if a.scheduled and not a.has("node-phases")]


def inputs(rank: int, count: int) -> np.ndarray:
    """Small integers as float64: every order of summation gives the exact sum."""
    return ((np.arange(count) * 7 + rank * 3) % 16 - 8).astype(np.float64)


def _rank_main(rank, size, listeners, ports, count, algorithms, fail, timeout, results):
    comm = SocketComm.connect(rank, size, listeners[rank], ports)
    for s in listeners:
        if s.fileno() != -1:
            s.close()
    try:
        for name in algorithms:
            sched = inprocess.schedules("allreduce", name, size, count)[rank]   # defaults
            buf = inputs(rank, count)
            before = dict(comm.traffic)
            if fail == "freeze":
                os.kill(os.getpid(), signal.SIGSTOP)
            elif fail == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            t0 = time.perf_counter()
            execute(sched, buf, comm, op="sum", timeout=timeout)
            results.put({"rank": rank, "algorithm": name, "ok": True,
                         "seconds": time.perf_counter() - t0, "sum": buf.tobytes(),
                         "bytes_sent": comm.traffic["bytes_sent"] - before["bytes_sent"],
                         "bytes_received": comm.traffic["bytes_received"]
                         - before["bytes_received"]})
    except PeerFault as e:
        results.put({"rank": rank, "ok": False, "error": type(e).__name__, "message": str(e),
                     "peers": e.peers, "seconds": time.perf_counter() - t0})
    finally:
        comm.close()


def launch(size: int, count: int, algorithms, *, victim=None, fail=None, timeout=None,
           deadline: float = 60.0) -> tuple[list[dict], list[int], float]:
    """Run ``size`` rank processes; returns (their reports, ranks still running at the
    deadline -- killed then -- and the seconds waited)."""
    ctx = mp.get_context("fork")
    listeners, ports = open_listeners(size)
    results = ctx.Queue()
    procs = [ctx.Process(target=_rank_main, args=(
        r, size, listeners, ports, count, algorithms, fail if r == victim else None, timeout,
        results)) for r in range(size)]
    for p in procs:
        p.start()
    for s in listeners:
        s.close()
    reports, t0 = [], time.monotonic()
    expected = len(algorithms) * size
    while time.monotonic() - t0 < deadline and len(reports) < expected:
        try:
            reports.append(results.get(timeout=0.1))
        except Exception:   # noqa: BLE001 - queue.Empty: poll again
            pass
        if all(not p.is_alive() or (victim is not None and r == victim)
               for r, p in enumerate(procs)) and results.empty():
            break
    waited = time.monotonic() - t0
    done = {}
    for rep in reports:
        done[rep["rank"]] = done.get(rep["rank"], 0) + (len(algorithms) if not rep["ok"] else 1)
    hung = [r for r in range(size) if r != victim and done.get(r, 0) < len(algorithms)]
    for r, p in enumerate(procs):           # bounded: nothing outlives the lab
        if r not in hung and r != victim:
            p.join(5)
        if p.is_alive():
            os.kill(p.pid, signal.SIGKILL)
            os.kill(p.pid, signal.SIGCONT)
        p.join(5)
    return reports, hung, waited


def silent_culprits(reports: list[dict]) -> list[int]:
    """Ranks some report names but that did not report: the failed ones. (A rank that gives up
    closes its connections, so its neighbours then name *it*; it reported, so it is cleared.)"""
    reported = {rep["rank"] for rep in reports}
    return sorted({p for rep in reports for p in rep.get("peers", [])} - reported)


def show(reports: list[dict]) -> None:
    for rep in sorted(reports, key=lambda r: r["rank"]):
        print(f"#    rank {rep['rank']}: {rep.get('error', 'finished')}: {rep.get('message', '')}")


def main(argv=None) -> int:
    ap = parser(__doc__)
    ap.add_argument("--world", type=int, default=4, help="ranks (processes), default 4")
    ap.add_argument("--count", type=int, default=100_000, help="float64 elements per rank")
    ap.add_argument("--victim", type=int, default=None, help="the rank that fails (default last)")
    ap.add_argument("--timeout", type=float, default=1.0, help="for demo 2 (seconds)")
    ap.add_argument("--hang-seconds", type=float, default=3.0,
                    help="demo 1 declares a hang when no rank finished after this long")
    args = ap.parse_args(argv)
    size, count = args.world, args.count
    victim = size - 1 if args.victim is None else args.victim
    V = count * 8
    kernels.warmup("sum", np.float64)       # compiled once, inherited by the ranks

    reports, hung, _ = launch(size, count, FLAT)
    want = sum(inputs(r, count) for r in range(size))
    table, ok = {}, True
    for rep in reports:
        if not rep["ok"]:
            ok = False
            print(f"# rank {rep['rank']}: {rep['error']}: {rep['message']}")
            continue
        good = np.frombuffer(rep["sum"], np.float64).tobytes() == want.tobytes()
        ok &= good
        table.setdefault(rep["algorithm"], []).append(
            (rep["rank"], rep["bytes_sent"], rep["bytes_received"], rep["seconds"], good))
    if len(reports) != len(FLAT) * size or hung:
        print(f"# only {len(reports)} of {len(FLAT) * size} reports; hung: {hung}")
        ok = False
    print(f"# {size} processes over TCP on 127.0.0.1, V = {V} bytes per rank; bytes sent per "
          "rank (max over ranks), result checked against the exact sum on every rank")
    print("# algorithm            bytes sent    / V    expected          correct  seconds (max)")
    expect = {"ring": (2 * (size - 1) * V // size, "2(N-1)/N.V"),
              "naive": ((size - 1) * V, "(N-1).V")}
    rows = {}
    for name in FLAT:
        ranks = sorted(table.get(name, []))
        sent = max((r[1] for r in ranks), default=0)
        formula = expect.get(name, (None, ""))
        good = len(ranks) == size and all(r[4] for r in ranks)
        rows[name] = {"bytes_sent_per_rank": [r[1] for r in ranks],
                      "bytes_received_per_rank": [r[2] for r in ranks],
                      "correct": good, "seconds": max((r[3] for r in ranks), default=None)}
        print(f"# {name:<20} {sent:>11} {sent / V:>7.3f}    "
              f"{'' if formula[0] is None else f'{formula[0]} = {formula[1]}':<18} {good!s:<8} "
              f"{rows[name]['seconds'] or 0:.4f}")
    ring_sent = max(rows["ring"]["bytes_sent_per_rank"], default=0)

    print(f"\n# failure demo: rank {victim} of {size} fails at the start of a ring all-reduce")
    reports1, hung1, waited1 = launch(size, count, ["ring"], victim=victim, fail="freeze",
                                      deadline=args.hang_seconds)
    print(f"# 1. frozen, no timeout: after {waited1:.1f} s, {len(hung1)} of {size - 1} live "
          f"ranks still inside the all-reduce (ranks {hung1}): a hang; the lab killed them")
    reports2, hung2, waited2 = launch(size, count, ["ring"], victim=victim, fail="freeze",
                                      timeout=args.timeout, deadline=args.timeout + 20)
    culprits = silent_culprits(reports2)
    print(f"# 2. frozen, timeout={args.timeout:g} s: {len(reports2)} ranks raised within "
          f"{waited2:.1f} s; named but silent: rank(s) {culprits}")
    show(reports2)
    reports3, hung3, waited3 = launch(size, count, ["ring"], victim=victim, fail="kill",
                                      deadline=20)
    lost = silent_culprits(reports3)
    print(f"# 3. killed, no timeout: {len(reports3)} ranks raised within {waited3:.1f} s; named "
          f"but silent: rank(s) {lost}; still hung: {hung3}")
    show(reports3)

    for rep in reports1 + reports2 + reports3:
        rep.pop("sum", None)                # the result's bytes: checked above, not JSON
    write_json(args.json, {
        "world": size, "count": count, "V": V, "correct": ok, "algorithms": rows,
        "freeze_no_timeout": {"hung_ranks": hung1, "waited_s": waited1,
                              "reports": reports1},
        "freeze_timeout": {"timeout_s": args.timeout, "reports": reports2,
                           "culprits": culprits, "waited_s": waited2, "hung_ranks": hung2},
        "kill": {"reports": reports3, "named": lost, "hung_ranks": hung3,
                 "waited_s": waited3}})
    claim("lab_sockets",
          "ring moves 2(N-1)/N.V per rank; one dead rank hangs everyone; a timeout names it",
          f"N={size}: ring {ring_sent / V:.3f} V per rank (2(N-1)/N = {2 * (size - 1) / size:.3f})"
          f", result {'exact' if ok else 'WRONG'}; frozen rank {victim}: "
          f"{len(hung1)}/{size - 1} ranks hung {waited1:.0f} s without timeout, timeout named "
          f"{culprits}, kill named {lost}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
