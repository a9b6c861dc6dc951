"""``mpicoll simulate``: predicted times of the algorithms' own schedules on a modelled fabric.

    mpicoll simulate --fabric flat --alpha 2us --bandwidth 25GB/s -N 8 -a ring,recursive_doubling \\
        -b 1K -e 4G -f 10
    mpicoll simulate --fabric dgx-h100 --nodes 3072 --per-node 8 -a ring,hierarchical -b 1M -e 1G
    mpicoll simulate --fabric seed-lab --nodes 2 --per-node 8 -a ring --order rail

Columns as ``mpicoll bench``'s (GB = 1e9 B, algbw = size / time, busbw = algbw x the bus factor),
from the timed executor (``mpicoll.simulators.timed``) instead of a clock, then the protocol and
channels used, the bottleneck link (the one that held messages back longest) and the bytes it
carried, the bytes that crossed nodes and the rank pairs that cross rails.
Fabrics: ``flat`` (one switch; ``--alpha``, ``--bandwidth``), ``dgx-a100``, ``dgx-h100``,
``dgx-h200`` (as NCCL runs them: channels, NCCL's protocols and tuning, event-driven steps,
NVLink SHARP; ``--channels 1`` for one ring), ``dgx-h100-roce`` (on RoCE), ``dgx-h100-sharp``
(IB SHARP enabled), ``dgx-h100-textbook`` (one channel, lockstep), ``seed-lab``,
``this-machine`` (from ``--profile``, a ``mpicoll calibrate`` profile) or a JSON file
(``docs/simulator.md``). All-reduces the switches reduce: ``nvls``, ``nvls_tree``, ``collnet``;
``nccl`` (or ``auto``): the algorithm NCCL's tuning picks at each size, shown after it
(``nccl=nvls_tree``). ``--json`` writes bench's record keys plus the fabric's, so
``mpicoll plot`` draws it. A run longer than a few seconds shows its progress on stderr: a bar on
a terminal, else a line every 10 s.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import re
import sys
import threading
import time
from pathlib import Path

from ..simulators import fabric as fabrics
from ..simulators.timed import IN_SWITCH, simulate
from ..registry import COLLECTIVES
from .cli import Parser, positive_int, prepare_output
from .sizes import size_arg, sizes_from

__all__ = ["main", "parse_seconds", "parse_bandwidth"]

_SECONDS = {"": 1.0, "s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9, "ps": 1e-12}
_RATES = {"": 1.0, "b/s": 1.0, "kb/s": 1e3, "mb/s": 1e6, "gb/s": 1e9, "tb/s": 1e12}
DEFAULT_PER_NODE = {"flat": 1, "dgx-h100": 8, "dgx-h100-textbook": 8, "dgx-h200": 8,
                    "dgx-a100": 8, "seed-lab": 8, "dgx-h100-nccl": 8, "dgx-a100-nccl": 8,
                    "dgx-h100-roce": 8, "dgx-h100-sharp": 8}
NOT_SCHEDULED = (*IN_SWITCH, "nccl", "auto")     # all-reduces simulated without a schedule


def _number_unit(text: str, what: str) -> tuple[float, str]:
    m = re.fullmatch(r"\s*([0-9.]+(?:[eE][-+]?[0-9]+)?)\s*(\S*)\s*", text)
    if not m:
        raise argparse.ArgumentTypeError(f"not {what}: {text!r}")
    return float(m.group(1)), m.group(2)


def parse_seconds(text: str) -> float:
    """``2us``, ``1.5ms``, ``500ns``, ``2e-6`` -> seconds. A bare number of 1 ms or more is
    refused: a message or byte time that long is a unit left off (``--alpha 2`` meant 2us)."""
    value, unit = _number_unit(text, "a time")
    if unit not in _SECONDS:
        raise argparse.ArgumentTypeError(f"not a time: {text!r} (use s, ms, us, ns or ps)")
    if not unit and value >= 1e-3:
        raise argparse.ArgumentTypeError(f"{text!r} without a unit is {value:g} s; give the unit "
                                         f"(e.g. {text}us)")
    return value * _SECONDS[unit]


def parse_bandwidth(text: str) -> float:
    """``25GB/s`` (bytes), ``400Gb/s`` (bits), ``25e9`` -> bytes per second."""
    value, unit = _number_unit(text, "a bandwidth")
    bits = unit[-3:-2] == "b" if unit else False
    if unit.lower() not in _RATES or value <= 0:
        raise argparse.ArgumentTypeError(f"not a bandwidth: {text!r} (use e.g. 25GB/s or "
                                         "400Gb/s)")
    if not unit and value < 1e6:         # --bandwidth 25 meant 25GB/s, not 25 B/s
        raise argparse.ArgumentTypeError(f"{text!r} without a unit is {value:g} B/s; give the "
                                         f"unit (e.g. {text}GB/s)")
    return value * _RATES[unit.lower()] / (8 if bits else 1)


def parse_args(argv):
    ap = Parser("mpicoll simulate", __doc__.split("\n\n")[0])
    ap.add_argument("--fabric", default="flat",
                    help=f"{', '.join(fabrics.PRESETS)} or a JSON file")
    ap.add_argument("-N", "--nranks", type=positive_int, help="ranks (nodes x per-node)")
    ap.add_argument("--nodes", type=positive_int, help="nodes")
    ap.add_argument("--per-node", type=positive_int, help="ranks per node")
    ap.add_argument("-a", "--algorithms", help="comma list (default: every one with a "
                                               "schedule); nvls, nvls_tree, collnet: the "
                                               "switches reduce; nccl (auto): NCCL's pick")
    ap.add_argument("-b", "--minbytes", type=size_arg, default="8", help="smallest size")
    ap.add_argument("-e", "--maxbytes", type=size_arg, default="64M", help="largest size")
    ap.add_argument("-f", "--stepfactor", type=float, default=4, help="size factor")
    ap.add_argument("--order", choices=["rank", "node", "rail"],
                    help="ring order, for the algorithms that declare an order option")
    ap.add_argument("--collective", default="allreduce", choices=list(COLLECTIVES),
                    help="which collective")
    ap.add_argument("--alpha", type=parse_seconds, help="flat: seconds per message (2us)")
    ap.add_argument("--bandwidth", type=parse_bandwidth, help="flat: bytes/s (25GB/s)")
    ap.add_argument("--gamma", type=parse_seconds, help="seconds per byte reduced (e.g. 1ps)")
    ap.add_argument("--profile", help="this-machine: a mpicoll calibrate profile")
    ap.add_argument("--channels", type=positive_int,
                    help="split each all-reduce over this many rings/trees, one per NIC "
                         "(default: the fabric's)")
    ap.add_argument("--protocol", help="force one of the fabric's protocols, or 'fastest' "
                                       "(default: NCCL's pick for ring and tree on a fabric "
                                       "that names its GPU, else the fastest per size)")
    ap.add_argument("--json", metavar="PATH", help="write the results here (bench's keys)")
    args = ap.parse_args(argv)
    if args.fabric not in fabrics.PRESETS and not Path(args.fabric).is_file():
        ap.error(f"--fabric: unknown fabric {args.fabric!r}; expected one of "
                 f"{list(fabrics.PRESETS)} or a JSON file")
    if (args.alpha is not None or args.bandwidth is not None) and args.fabric != "flat":
        ap.error(f"--alpha and --bandwidth set the flat fabric, not {args.fabric!r}")
    if args.profile and args.fabric != "this-machine":
        ap.error("--profile goes with --fabric this-machine")
    if args.stepfactor < 1:
        ap.error(f"-f must be >= 1, got {args.stepfactor}")
    return ap, args


def layout(ap, args) -> tuple[int, int]:
    """(nodes, ranks per node) from -N / --nodes / --per-node."""
    default = DEFAULT_PER_NODE.get(args.fabric)
    if args.nranks is not None:
        if args.nodes is not None:
            if args.nranks % args.nodes:
                ap.error(f"-N {args.nranks} is not a multiple of --nodes {args.nodes}")
            return args.nodes, args.nranks // args.nodes
        per = args.per_node or default or args.nranks     # this-machine, files: one node
        per = min(per, args.nranks)
        if args.nranks % per:
            ap.error(f"-N {args.nranks} is not a multiple of {per} ranks per node "
                     f"(give --nodes and --per-node)")
        return args.nranks // per, per
    if args.nodes is None:
        ap.error("give -N RANKS, or --nodes K and --per-node G")
    return args.nodes, args.per_node or default or 1


class Progress:
    """Progress of a run on ``stream``, from a thread: after ``after`` seconds, a bar redrawn
    every ``every`` seconds on a terminal (0.5), else a line every ``every`` (10: a log, a pipe).
    ``row(done, label)`` before each row; print a row inside ``aside()`` (the bar is erased
    first and waits); ``close()`` at the end (it erases the bar)."""

    def __init__(self, total: int, stream=sys.stderr, *, every: float | None = None,
                 after: float = 3.0):
        self.total, self.stream, self.done, self.label = total, stream, 0, ""
        self.tty = stream.isatty()
        self.every = every or (0.5 if self.tty else 10.0)
        self.after, self.start = after, time.monotonic()
        self.drawn, self._stop, self._lock = False, threading.Event(), threading.Lock()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    @contextlib.contextmanager
    def aside(self):
        with self._lock:
            self._erase()
            yield

    def _erase(self) -> None:
        if self.drawn:
            print("\r\x1b[K", end="", file=self.stream, flush=True)
            self.drawn = False

    def row(self, done: int, label: str) -> None:
        self.done, self.label = done, label

    def text(self) -> str:
        elapsed = int(time.monotonic() - self.start)
        return (f"{self.done}/{self.total} rows done, simulating {self.label}, "
                f"{elapsed // 60}:{elapsed % 60:02d} elapsed")

    def _run(self) -> None:
        if self._stop.wait(self.after):
            return
        while True:
            with self._lock:
                if self.tty:
                    filled = 20 * self.done // max(self.total, 1)
                    print(f"\r[{'#' * filled}{'.' * (20 - filled)}] {self.text()}\x1b[K",
                          end="", file=self.stream, flush=True)
                    self.drawn = True
                else:
                    print(f"mpicoll simulate: {self.text()}", file=self.stream, flush=True)
            if self._stop.wait(self.every):
                return

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self._erase()


def main(argv=None) -> int:
    ap, args = parse_args(sys.argv[1:] if argv is None else argv)
    problem = args.json and prepare_output(args.json)
    if problem:
        ap.error(problem)
    table = COLLECTIVES[args.collective]
    names = (args.algorithms.split(",") if args.algorithms
             else [n for n, a in table.items() if a.scheduled])
    algos = {}
    for name in names:
        if name in NOT_SCHEDULED and args.collective == "allreduce":   # checked by simulate
            algos[name] = None
            continue
        if name not in table and not any(name in a.aliases for a in table.values()):
            ap.error(f"unknown {args.collective} algorithm {name!r}; expected one of "
                     f"{[n for n, a in table.items() if a.scheduled]}"
                     + (f" or {', '.join(NOT_SCHEDULED)}" if args.collective == "allreduce"
                        else ""))
        algos[name] = algo = next(a for n, a in table.items() if name == n or name in a.aliases)
        if not algo.scheduled:
            ap.error(f"{name!r} has no schedule ({algo.describe()}): nothing to simulate")
    nodes, per_node = layout(ap, args)
    try:
        fabric = fabrics.preset(args.fabric, nodes, per_node, alpha=args.alpha,
                                bandwidth=args.bandwidth, gamma=args.gamma,
                                profile=args.profile)
    except ValueError as e:
        ap.error(str(e))
    options = {}
    for name, algo in algos.items():
        declared = {o.name for o in algo.options} if algo is not None else set()
        options[name] = {"order": args.order} if args.order and "order" in declared else {}
        if args.channels:
            options[name]["channels"] = args.channels
        if args.protocol:
            if not fabric.protocols or args.protocol not in [*fabric.protocols, "fastest"]:
                ap.error(f"--protocol {args.protocol}: {fabric.name} declares "
                         f"{list(fabric.protocols or [])}")
            options[name]["protocol"] = args.protocol
    if args.order and not any(o.get("order") for o in options.values()):
        ap.error(f"--order: none of {names} declares an `order` option")
    sizes = sizes_from(args.minbytes, args.maxbytes, args.stepfactor)
    if not sizes:
        ap.error(f"empty size range: -b {args.minbytes} is above -e {args.maxbytes}")
    print(f"# mpicoll simulate: {args.collective}, {fabric.size} ranks, {fabric.describe()}")
    print("# time = the last rank's finish on the timed executor; GB = 1e9 B; busbw = algbw x "
          "the bus factor; max link = the bottleneck (the link that held messages back "
          "longest) and the bytes it carried")
    print(f"{'size(B)':>10} {'count':>9} {'type':>7} {'redop':>5} {'algorithm':>18} | "
          f"{'time(us)':>10} {'algbw':>7} {'busbw':>7} | {'proto,ch':>9} {'max link':>26} "
          f"{'bytes':>10} {'internode':>10} {'x-rail':>6}")
    records = []
    progress = Progress(len(sizes) * len(names))
    try:
        for nbytes in sizes:
            for name in names:
                progress.row(len(records), f"{nbytes} B {name}")
                try:
                    r = simulate(args.collective, name, fabric, nbytes, **options[name])
                except ValueError as e:
                    ap.error(f"{name}: {e}")
                t_us = r.time * 1e6
                label = f"{name}={r.algorithm}" if r.algorithm else name
                records.append({
                    "collective": args.collective, "algorithm": label, "size": r.nbytes,
                    "count": r.nbytes // 4, "dtype": "float32", "op": "sum", "inplace": False,
                    **{k: t_us for k in ("time_us", "time_us_min", "time_us_max",
                                         "time_us_p90", "time_us_p99")},
                    "iters": 1, "algbw": r.algbw / 1e9, "busbw": r.busbw / 1e9, "wrong": 0,
                    "vs_mpi": None, "bytes_sent": None, "predicted_us": t_us,
                    "auto_choice": None, "nranks": fabric.size, "nodes": fabric.nodes,
                    "per_node": fabric.per_node, "fabric": fabric.name,
                    "max_link_bytes": r.max_link_bytes, "max_link": r.max_link,
                    "cross_rail_hops": r.cross_rail_hops, "internode_hops": r.internode_hops,
                    "internode_bytes": r.internode_bytes,
                    "bottleneck_GBps": r.bottleneck_bw / 1e9, "class_bytes": r.class_bytes,
                    "path_messages": r.path_messages, "critical_path": r.critical,
                    "order": options[name].get("order"), "protocol": r.protocol,
                    "channels": r.channels, "max_link_time_us": r.max_link_time * 1e6})
                with progress.aside():
                    print(f"{r.nbytes:>10} {r.nbytes // 4:>9} {'float32':>7} {'sum':>5} "
                          f"{label:>18} | {t_us:>10.1f} {r.algbw / 1e9:>7.3f} "
                          f"{r.busbw / 1e9:>7.3f} | "
                          f"{(r.protocol or '-') + ',' + str(r.channels):>9} {r.max_link:>26} "
                          f"{r.max_link_bytes:>10.3g} {r.internode_bytes:>10.3g} "
                          f"{r.cross_rail_hops:>6}", flush=True)
    finally:
        progress.close()
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"nranks": fabric.size, "nodes": fabric.nodes, "per_node": fabric.per_node,
                       "ranks_per_node": fabric.per_node, "fabric": fabric.to_json(),
                       "collective": args.collective, "dtype": "float32", "op": "sum",
                       "mpi_library": f"timed simulator, fabric {fabric.name}",
                       "command": " ".join(["mpicoll simulate"] + list(argv or sys.argv[1:])),
                       "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "records": records},
                      f, indent=1)
        print(f"# wrote {args.json}")
    return 0
