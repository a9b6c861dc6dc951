"""``mpicoll bench``: every algorithm against the MPI library's own collective, in one job.

    mpiexec -n 4 mpicoll bench -b 8 -e 4M -f 4 --json r.json

Conventions are nccl-tests' and OSU's: sizes by ``-b/-e/-f`` (or ``-m MIN:MAX``), K/M/G
suffixes; columns ``size count type redop algorithm place | time(us) algbw busbw #wrong |
vs_mpi pred(us) sent/size``. Bandwidths are in GB/s with GB = 1e9 B: algbw = size / time and
busbw = algbw x 2(N-1)/N (all-reduce), (N-1)/N (reduce-scatter, all-gather) or 1 (broadcast).
``vs_mpi`` = MPI's time / this algorithm's time at the same size: above 1 is faster than the MPI
library. ``pred(us)`` is the cost model's time for the algorithm (``mpicoll model``; the profile
is ``--profile``, else ``$MPICOLL_PROFILE``, else the shipped one); ``sent/size`` the bytes rank 0
sent over the size.

Timing: each call sits between barriers; an iteration's time is the slowest rank's; the table
gives the median (``--full`` adds min, max, p90, p99). At each size the algorithms take turns
in a fresh random order every iteration (the same order on every rank), so drift of the machine
hits them all alike. ``mpi`` is timed as ``comm.Allreduce`` (etc.) straight through mpi4py, the
way an application calls it; mpicoll's algorithms include the cost of mpicoll's Python layer
(argument checks, schedule lookup, a few microseconds). Iterations shrink with size on the
IMB rule (a 64 MiB volume per measurement, between 5 and 200) unless ``-n`` is given.

``--persistent`` times mpicoll's algorithms (``auto`` included) through the persistent form,
a handle made once per size and algorithm by ``mpicoll.allreduce_init`` (etc.) and called as
``h()``: what a training loop that reduces the same buffers every step pays. ``mpi`` stays the
plain mpi4py call, so ``vs_mpi`` compares against the library as applications usually call it.
Its results are checked too (one extra call before the warm-up).

``--reproducible`` adds ``reproducible`` (``mpicoll.allreduce(..., reproducible=True)``,
``auto`` underneath; ``mpicoll.reproducible``) to the algorithms, by default ``auto``,
``reproducible`` and ``mpi``, and prints its time over the plain ``auto`` call's per size.

Hangs: the validation and warm-up calls run with ``timeout=--timeout`` (300 s) and
``on_timeout="abort"``, so a rank that is missing or stuck ends the job with the culprit named
instead of hanging it; the timed calls run without a timeout, as an application's would.

Validation (on by default, outside the timed loop): inputs are small integers, whose sums and
products are exact in any order, so ``#wrong`` counts exactly the elements that differ from the
closed-form answer, summed over ranks. Any wrong element anywhere makes the exit status 1.
With ``--no-check`` nothing is compared: ``#wrong`` shows ``-`` and the JSON's ``wrong`` is null.
``bytes_sent`` (and ``sent/size``) is what the executor counted on each rank during the
validation call: the bytes of the sends it posted, which the schedule lists -- a count, not a
measurement of what the MPI library moved.

Every dtype and op MPI allows runs: an algorithm that can't run here is left out with a
``# not run:`` line naming why (one whose module's ``supports(op, dtype)`` refuses the pair;
``shm`` across nodes; ``mpi`` on a dtype the MPI library has no datatype for, bfloat16, where
vs_mpi shows ``-``). A warning on stderr says when a node runs more ranks than it has cores, or
when one rank runs alone (no ``mpiexec``); a note under the table says when ``pred(us)`` comes
from a profile measured elsewhere or the ranks share cores, which it does not model.
"""

from __future__ import annotations

import csv
import json
import os
import socket
import sys
import time

import mpi4py
import numba
import numpy as np
from mpi4py import MPI

import mpicoll

from .. import __version__, kernels, settings
from .._runtime.context import state
from ..kernels import as_storage, check
from ..model import ProfileError, load_profile, predict
from ..ops import library_has
from ..plan import last as last_plan
from ..registry import COLLECTIVES, bus_factor, lookup
from ..testing import exact_input, exact_result
from .cli import (Parser, check_settings, nonnegative_int, positive_int, prepare_output,
                  seconds_arg, step_factor)
from .sizes import parse_size, size_arg, sizes_from, too_many_sizes

__all__ = ["main", "run", "parse_args", "Case", "BUS_FACTOR"]

COLLECTIVE_NAMES = ("allreduce", "reduce_scatter_block", "allgather", "bcast")
DTYPES = ("float32", "float64", "int32", "int64", "int8", "int16", "uint8", "uint16", "uint32",
          "uint64", "float16", "bfloat16", "complex64", "complex128", "bool")  # kernels.DTYPES
OPS = ("sum", "prod", "max", "min", "land", "lor", "lxor", "band", "bor", "bxor")  # kernels.OPS


def _dtype(name: str) -> np.dtype:
    if name == "bfloat16":
        return kernels.bfloat16        # (imports ml_dtypes)
    return np.dtype(name)


def _reference(collective: str, dtype: np.dtype) -> bool:
    """Whether the MPI library can run the collective on ``dtype`` (``mpi``, the reference):
    it reduces only types it has a datatype for (not bfloat16); it moves any type's bytes."""
    return collective not in ("allreduce", "reduce_scatter_block") or library_has(dtype)
VOLUME = 64 << 20


BUS_FACTOR = bus_factor          # nccl-tests' bus bandwidth factor (mpicoll.registry)


def parse_args(argv):
    """The options, checked: a bad one is a one-line usage error (exit 2) before any measuring."""
    ap = Parser("mpicoll bench", __doc__)
    ap.add_argument("-b", "--minbytes", type=size_arg, default="8", help="smallest size")
    ap.add_argument("-e", "--maxbytes", type=size_arg, default="4M", help="largest size")
    ap.add_argument("-f", "--stepfactor", type=step_factor, default=4,
                    help="size factor between steps (1: every size; the last step ends at -e)")
    ap.add_argument("-m", "--message-size", metavar="MIN:MAX",
                    help="OSU-style size range, instead of -b and -e")
    ap.add_argument("-n", "--iters", type=positive_int,
                    help="timed iterations (default: a 64 MiB volume per size, 5 to 200)")
    ap.add_argument("-w", "--warmup", type=nonnegative_int, default=5, help="untimed calls")
    ap.add_argument("-a", "--algorithms",
                    help="comma list (default: all, auto and mpi); mpi is added anyway, the "
                         "reference of vs_mpi")
    ap.add_argument("-d", "--dtype", default="float32", choices=DTYPES,
                    help="element type")
    ap.add_argument("--op", default="sum", choices=OPS,
                    help="reduction (MPI's rules: e.g. max/min not on complex, land/lor/lxor on "
                         "integers and bool, band/bor/bxor on integers)")
    ap.add_argument("--inplace", action="store_true", help="time in-place calls")
    ap.add_argument("--outofplace", action="store_true",
                    help="time out-of-place calls (default; give both flags for both)")
    ap.add_argument("--collective", default="allreduce", choices=COLLECTIVE_NAMES,
                    help="which collective")
    ap.add_argument("--full", action="store_true", help="also min, max, p90, p99")
    ap.add_argument("--persistent", action="store_true",
                    help="time mpicoll's algorithms through persistent handles "
                         "(mpicoll.allreduce_init ...), made once per size")
    ap.add_argument("--progress", action="store_true",
                    help="show progress on stderr (on by itself when stdout is a terminal; "
                         "under mpiexec a rank's stdout is a pipe, so pass this)")
    ap.add_argument("--reproducible", action="store_true",
                    help="also time reproducible=True (default algorithms: auto, reproducible, "
                         "mpi); allreduce or reduce_scatter_block, sum, float types")
    ap.add_argument("--no-check", action="store_true",
                    help="skip validation (the #wrong column then shows -)")
    ap.add_argument("--json", metavar="PATH", help="write the results as JSON (rank 0)")
    ap.add_argument("--csv", metavar="PATH", help="write the results as CSV (rank 0)")
    ap.add_argument("--profile", help="cost-model profile for the pred(us) column (default: "
                                      "$MPICOLL_PROFILE, else the shipped one)")
    ap.add_argument("--seed", type=int, default=12345, help="seed of the interleaving order")
    ap.add_argument("--timeout", type=seconds_arg, default=300,
                    help="seconds (or 10m, 1h) before a hung validation or warm-up call aborts "
                         "the job (default 300; 0: never). Timed calls run without one, as "
                         "users' do.")
    args = ap.parse_args(argv)
    check_settings(ap)
    if args.message_size:
        lo, _, hi = args.message_size.partition(":")
        try:
            args.minbytes = parse_size(lo) if lo else args.minbytes
            args.maxbytes = parse_size(hi) if hi else args.maxbytes
        except ValueError as e:
            ap.error(f"argument -m/--message-size: {e}")
    crowded = too_many_sizes(args.minbytes, args.maxbytes, args.stepfactor)
    if crowded:
        ap.error(crowded)
    if not sizes_from(args.minbytes, args.maxbytes, args.stepfactor):
        ap.error(f"empty size range: the smallest size ({args.minbytes} B) is above the largest "
                 f"({args.maxbytes} B)")
    reduces = args.collective in ("allreduce", "reduce_scatter_block")
    try:
        if reduces:
            check(args.op, _dtype(args.dtype))
    except TypeError as e:
        ap.error(f"argument --op: {e}")
    table = COLLECTIVES[args.collective]
    names = args.algorithms.split(",") if args.algorithms is not None else []
    if "mpi" in names and not _reference(args.collective, _dtype(args.dtype)):
        ap.error(f"argument -a/--algorithms: the MPI library has no datatype for "
                 f"{args.dtype}, so 'mpi' can't reduce it")
    if args.reproducible and (not reduces or args.op != "sum"
                              or args.dtype not in ("float32", "float64", "float16", "bfloat16")):
        ap.error("--reproducible: allreduce or reduce_scatter_block, --op sum, a float dtype")
    unknown = [a for a in names if a not in ("auto", "reproducible") and a not in table]
    if unknown:
        ap.error(f"unknown {args.collective} algorithm(s) {unknown}; expected a comma list of "
                 f"{list(table) + ['auto']}")
    try:
        load_profile(args.profile)
    except (ProfileError, ValueError) as e:
        ap.error(f"argument --profile: {e}")
    return args


def preamble(comm, args, nodes) -> dict:
    hosts = comm.allgather(socket.gethostname())
    sizes = [len(n) for n in nodes]
    return {
        "nranks": comm.Get_size(),
        "nodes": len(nodes),
        "ranks_per_node": sizes[0] if len(set(sizes)) == 1 else sizes,
        "hosts": list(dict.fromkeys(hosts)),
        "mpi_library": " ".join(MPI.Get_library_version().splitlines()[0].split()),
        "versions": {"mpicoll": __version__, "mpi4py": mpi4py.__version__,
                     "numpy": np.__version__, "numba": numba.__version__,
                     "python": sys.version.split()[0]},
        "slurm_job_id": os.environ.get("SLURM_JOB_ID"),
        "slurm_nodelist": os.environ.get("SLURM_JOB_NODELIST") or os.environ.get("SLURM_NODELIST"),
        "command": " ".join([os.path.basename(sys.argv[0])] + sys.argv[1:]),
        "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "collective": args.collective, "dtype": args.dtype, "op": args.op,
        "persistent": args.persistent,
        "virtual_nodes": settings.get("MPICOLL_RANKS_PER_NODE"),
    }


class Case:
    """Buffers, call and answer of one collective at one size: built once, run many times."""

    def __init__(self, collective, comm, nbytes, dtype, op, inplace):
        self.collective, self.comm, self.op, self.inplace = collective, comm, op, inplace
        self.handles = {}
        size, rank = comm.Get_size(), comm.Get_rank()
        itemsize = np.dtype(dtype).itemsize
        count = max(1, nbytes // itemsize)
        if collective in ("reduce_scatter_block", "allgather"):
            count = max(size, count // size * size)     # a whole block per rank
        self.count, self.nbytes = count, count * itemsize
        block = count // size
        if collective == "allreduce":
            self.input = exact_input(rank, count, dtype, op)
            self.answer = exact_result(size, count, dtype, op)
            self.out = np.empty(count, dtype)
        elif collective == "reduce_scatter_block":
            self.input = exact_input(rank, count, dtype, op)
            self.answer = exact_result(size, count, dtype, op)[rank * block:(rank + 1) * block]
            self.out = np.empty(count if inplace else block, dtype)
        elif collective == "allgather":
            self.input = exact_input(rank, block, dtype, "sum")
            self.answer = np.concatenate([exact_input(r, block, dtype, "sum")
                                          for r in range(size)])
            self.out = np.empty(count, dtype)
            self.block = block
        else:   # bcast from rank 0
            self.input = exact_input(0, count, dtype, "sum")
            self.answer = self.input.copy()
            self.out = np.empty(count, dtype)
        self._outs = {}

    def use(self, algorithm):
        """Make ``out`` ``algorithm``'s own output buffer. Each algorithm writes its own: a
        buffer that another algorithm's transfers just left in the other core's cache (MPI's
        single-copy reads of it) would charge the first writes of the next algorithm for
        invalidating those lines (4x a local write here, docs/performance.md)."""
        out = self._outs.get(algorithm)
        if out is None:
            out = self._outs[algorithm] = np.empty_like(self.out)
        self.out = out

    def reset(self):
        """Put the input back where an in-place call (or bcast) reads it; untimed."""
        c, rank = self.collective, self.comm.Get_rank()
        if c == "bcast":
            if rank == 0:
                self.out[...] = self.input
            else:
                self.out[...] = 0
        elif self.inplace and c == "allgather":
            self.out[rank * self.block:(rank + 1) * self.block] = self.input
        elif self.inplace:
            self.out[...] = self.input

    def call(self, algorithm, timeout=None):
        """One call; with ``timeout``, a hang aborts the job (``on_timeout="abort"``)."""
        c = self.collective
        send = MPI.IN_PLACE if self.inplace else self.input
        kw = dict(algorithm=algorithm, comm=self.comm)
        if algorithm == "reproducible":
            kw = dict(algorithm="auto", comm=self.comm, reproducible=True)
        if timeout:
            kw.update(timeout=timeout, on_timeout="abort")
        if algorithm == "mpi" and not timeout:   # timed: the library itself, no mpicoll layer
            self.mpi_call(send)
        elif c == "allreduce":
            mpicoll.allreduce(send, self.out, op=self.op, **kw)
        elif c == "reduce_scatter_block":
            mpicoll.reduce_scatter_block(send, self.out, op=self.op, **kw)
        elif c == "allgather":
            mpicoll.allgather(send, self.out, **kw)
        else:
            mpicoll.bcast(self.out, 0, **kw)

    def persistent(self, algorithm):
        """The persistent handle of ``algorithm`` on these buffers, made on first use
        (collective: every rank asks in the same order)."""
        h = self.handles.get(algorithm)
        if h is None:
            c = self.collective
            send = MPI.IN_PLACE if self.inplace else self.input
            kw = dict(algorithm=algorithm, comm=self.comm)
            if c == "allreduce":
                h = mpicoll.allreduce_init(send, self.out, op=self.op, **kw)
            elif c == "reduce_scatter_block":
                h = mpicoll.reduce_scatter_block_init(send, self.out, op=self.op, **kw)
            elif c == "allgather":
                h = mpicoll.allgather_init(send, self.out, **kw)
            else:
                h = mpicoll.bcast_init(self.out, 0, **kw)
            self.handles[algorithm] = h
        return h

    def mpi_call(self, send):
        """The MPI library's own collective, called straight through mpi4py."""
        c, comm, out = self.collective, self.comm, self.out
        op = getattr(MPI, self.op.upper())          # MPI.SUM ... MPI.BXOR
        send = send if send is MPI.IN_PLACE else as_storage(send)     # bfloat16: as uint16
        out = as_storage(out)
        if c == "allreduce":
            comm.Allreduce(send, out, op=op)
        elif c == "reduce_scatter_block":
            comm.Reduce_scatter_block(send, out, op=op)
        elif c == "allgather":
            comm.Allgather(send, out)
        else:
            comm.Bcast(out, root=0)

    def wrong(self) -> int:
        """Elements of the result whose bits differ from the exact answer."""
        got = self.out[:self.answer.size]
        return int((got.view(np.uint8).reshape(got.size, -1)
                    != self.answer.view(np.uint8).reshape(got.size, -1)).any(axis=1).sum())


def to_run(args, real_nodes: int) -> tuple[list[str], dict]:
    """The algorithms to run, in order, and ``{algorithm: why}`` for each one left out: the
    default list or ``-a``'s, with ``mpi`` (vs_mpi's reference) added, less what can't run here
    (a ``# not run:`` line each)."""
    table = COLLECTIVES[args.collective]
    dtype = _dtype(args.dtype)
    algorithms = (args.algorithms.split(",") if args.algorithms
                  else ["auto"] if args.reproducible
                  else [a for a in table if a != "mpi"] + ["auto", "mpi"])
    if args.reproducible and "reproducible" not in algorithms:
        algorithms.append("reproducible")
    if "mpi" not in algorithms:
        algorithms.append("mpi")            # vs_mpi needs the reference in the same run
    skipped = {}
    for a in algorithms:
        if a == "mpi" and not _reference(args.collective, dtype):
            skipped[a] = (f"the MPI library has no datatype for {args.dtype}: no vs_mpi "
                          f"column")
        elif (a not in ("auto", "mpi", "reproducible") and real_nodes > 1
              and lookup(args.collective, a).has("shared-memory")):
            skipped[a] = f"shared memory: the ranks span {real_nodes} nodes"
        elif (why := refusal(args.collective, a, args.op, dtype)) is not None:
            skipped[a] = why
    return [a for a in algorithms if a not in skipped], skipped


def alone(size: int) -> str | None:
    """A warning when the bench runs on one rank (started without ``mpiexec``), else None."""
    if size > 1:
        return None
    return ("1 rank: a collective over one rank moves nothing (busbw 0); launch several, e.g. "
            "mpiexec -n 4 mpicoll bench (srun -n 4 under Slurm)")


def pred_note(profile, profile_path, hosts, crowded) -> str | None:
    """Why ``pred(us)`` may be far from the times, for a line under the table: the profile was
    measured on other hosts (the shipped one: on its authors' machine), or ranks share cores
    here (the model gives each rank its own core and port), else None."""
    if profile is None:
        return None
    measured = list(profile.meta.get("hosts") or [])
    why = []
    if not set(measured) & set(hosts):
        where = ", ".join(measured) if measured else "an unnamed machine"
        why.append(f"the profile ({profile_path or 'the shipped one'}) was measured on "
                   f"{where}, not here: mpiexec -n 2 mpicoll calibrate -o profile.json, then "
                   f"--profile profile.json")
    if crowded:
        why.append("the ranks share cores here, which the model leaves out: waiting for a "
                   "core can make times 10-1000x pred(us)")
    return "pred(us) is the cost model's time; " + "; ".join(why) if why else None


def refusal(collective: str, algorithm: str, op: str, dtype: np.dtype) -> str | None:
    """Why ``algorithm`` can't run ``op`` on ``dtype`` (its module's ``supports(op, dtype)``
    says no), else None: the bench leaves it out with this line instead of crashing."""
    if algorithm in ("auto", "mpi", "reproducible"):
        return None
    supports = getattr(lookup(collective, algorithm).module, "supports", None)
    reduces = collective in ("allreduce", "reduce_scatter_block")
    if supports is None or not reduces or supports(op, dtype):
        return None
    return f"it does not reduce {op} on {dtype}"


def first_call(case: "Case", algorithm: str, timeout) -> str | None:
    """``case.call(algorithm)``, the validation call at a size: None if it ran, else the
    one-line reason the algorithm refused the arguments (ValueError/TypeError) on every rank. The refusal is agreed
    over the ranks, so all leave the algorithm out together; a rank that refused while others
    ran would leave them waiting until ``timeout`` aborts the job, naming it."""
    try:
        case.call(algorithm, timeout)
        why = None
    except (ValueError, TypeError) as e:
        why = str(e).splitlines()[0] if str(e) else type(e).__name__
    whys = case.comm.allgather(why)
    refused = [w for w in whys if w is not None]
    return refused[0] if refused else None


def oversubscribed(comm) -> str | None:
    """A warning when some node runs more ranks than it has cores (timings of small messages
    then measure the scheduler: waits of milliseconds where microseconds are usual), else
    None."""
    host = socket.gethostname()
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:
        cores = os.cpu_count() or 1
    per_host: dict = {}
    for h, c in comm.allgather((host, max(cores, os.cpu_count() or 1))):
        ranks, most = per_host.get(h, (0, 0))
        per_host[h] = (ranks + 1, max(most, c))
    worst = max(per_host.items(), key=lambda kv: kv[1][0] / kv[1][1])
    name, (ranks, cores) = worst
    if ranks <= cores:
        return None
    return (f"{ranks} ranks share {cores} core{'s' * (cores != 1)} on {name}: waiting ranks "
            f"compete for the cores, so times (small messages most) measure the scheduler "
            f"and can change 10-100x from run to run")


def stats(t: np.ndarray) -> dict:
    us = t * 1e6
    return {"time_us": float(np.median(us)), "time_us_min": float(us.min()),
            "time_us_max": float(us.max()), "time_us_p90": float(np.percentile(us, 90)),
            "time_us_p99": float(np.percentile(us, 99))}


def run(comm, args) -> tuple[dict, list[dict], int]:
    """Measure on ``comm`` (collective); rank 0 prints the table as it goes.

    Returns the preamble, the records and the number of wrong elements (the same on all ranks).
    """
    rank, size = comm.Get_rank(), comm.Get_size()
    reduces = args.collective in ("allreduce", "reduce_scatter_block")
    dtype = _dtype(args.dtype)
    kernels.warmup(args.op if reduces else kernels.ops_for(dtype)[0], dtype)
    nodes = state(comm).nodes()
    real_nodes = len(state(comm).real_nodes)
    reference = _reference(args.collective, dtype)
    algorithms, skipped = to_run(args, real_nodes)
    places = ([False] if args.outofplace or not args.inplace else []) + \
             ([True] if args.inplace else [])
    if args.collective == "bcast":
        places = [True]                     # a broadcast is always in place
    sizes = sizes_from(parse_size(args.minbytes), parse_size(args.maxbytes), args.stepfactor)
    profile = load_profile(args.profile)
    profile_path = args.profile or settings.get("MPICOLL_PROFILE")
    rpn = state(comm).ranks_per_node
    factor = BUS_FACTOR(args.collective, size)
    pre = preamble(comm, args, nodes)
    records, total_wrong = [], 0
    progress = rank == 0 and (args.progress or sys.stdout.isatty())
    crowded = oversubscribed(comm)          # collective: every rank asks

    if rank == 0:
        print(f"# mpicoll bench: {args.collective}, {size} ranks on {len(nodes)} node(s) "
              f"({pre['ranks_per_node']} per node), {args.dtype} {args.op}, {pre['mpi_library']}")
        print(f"# time = median over iterations of the slowest rank; busbw = algbw x "
              f"{factor:.3f}; vs_mpi > 1 means faster than MPI; sent/size = bytes rank 0 sent "
              f"/ size")
        for a, why in skipped.items():
            print(f"# not run: {a} ({why})")
        for warning in filter(None, (crowded, alone(size))):
            print(f"mpicoll bench: warning: {warning}", file=sys.stderr, flush=True)
        if args.persistent:
            print("# --persistent: mpicoll's algorithms timed through handles made once per "
                  "size (mpicoll.allreduce_init ...); mpi as a plain mpi4py call")
        print(f"# algbw, busbw in GB/s (1 GB = 1e9 B); algbw = size / time; #wrong = elements "
              f"that differ from the exact answer, over all ranks"
              f"{' (-: not checked, --no-check)' if args.no_check else ''}; pred(us) = the "
              f"cost model's time (mpicoll model) from {profile_path}")
        extra = f" {'min':>9} {'max':>9} {'p90':>9} {'p99':>9}" if args.full else ""
        print(f"{'size(B)':>10} {'count':>9} {'type':>7} {'redop':>5} {'algorithm':>18} "
              f"{'place':>5} | {'time(us)':>10} {'algbw':>7} {'busbw':>7} {'#wrong':>6} | "
              f"{'vs_mpi':>6} {'pred(us)':>9} {'sent/size':>9}{extra}", flush=True)

    for si, nbytes in enumerate(sizes):
        for inplace in places:
            case = Case(args.collective, comm, nbytes, _dtype(args.dtype), args.op, inplace)
            iters = args.iters or int(min(200, max(5, VOLUME // max(case.nbytes, 1))))
            chosen = None                   # the plan auto ran (recorded from its call)
            wrong, sent = {}, {}
            traffic = state(comm).traffic     # the executor's counters on this communicator
            persistent = {a: args.persistent and a not in ("mpi", "reproducible")
                          for a in algorithms}
            for a in list(algorithms):      # validation, byte counts and warm-up, untimed
                case.use(a)
                case.reset()
                before = traffic["bytes_sent"]
                why = first_call(case, a, args.timeout)
                if why is not None:         # refused on every rank, before any message
                    algorithms.remove(a)
                    if rank == 0:
                        since = f" from {case.nbytes} B" if si else ""
                        print(f"# not run{since}: {a} ({why})", flush=True)
                    continue
                if a == "auto":
                    chosen = last_plan(comm).algorithm.name
                sent[a] = comm.gather(traffic["bytes_sent"] - before, root=0)
                wrong[a] = None if args.no_check else comm.allreduce(case.wrong())
                if persistent[a]:           # the handle's own result is checked too
                    case.reset()
                    case.persistent(a)()
                    if not args.no_check:
                        wrong[a] += comm.allreduce(case.wrong())
                for _ in range(args.warmup):
                    case.reset()
                    if persistent[a]:
                        case.persistent(a)()
                    else:
                        case.call(a, args.timeout)
            times = {a: np.zeros(iters) for a in algorithms}
            order = np.random.default_rng([args.seed, si, int(inplace)])
            for it in range(iters):
                for a in order.permutation(algorithms):
                    case.use(a)
                    case.reset()
                    comm.Barrier()
                    if persistent[a]:
                        h = case.persistent(a)
                        t0 = MPI.Wtime()
                        h()
                    else:
                        t0 = MPI.Wtime()
                        case.call(a)
                    times[a][it] = MPI.Wtime() - t0
                if progress and it % 10 == 0:
                    print(f"\r[size {si + 1}/{len(sizes)}: {nbytes} B, iteration {it}/{iters}]",
                          end="", file=sys.stderr, flush=True)
            for a in algorithms:
                comm.Allreduce(MPI.IN_PLACE, times[a], op=MPI.MAX)   # the slowest rank
            if progress:
                print("\r" + " " * 60 + "\r", end="", file=sys.stderr, flush=True)
            mpi_time = float(np.median(times["mpi"])) if reference else None
            for a in algorithms:
                st = stats(times[a])
                runs = chosen if a == "auto" else a
                pred = (predict(runs, size, case.nbytes, profile, collective=args.collective,
                                ranks_per_node=rpn)
                        if profile and runs not in ("mpi", "reproducible") else None)
                t = st["time_us"] * 1e-6
                rec = {"collective": args.collective, "algorithm": a, "size": case.nbytes,
                       "persistent": persistent[a],
                       "count": case.count, "dtype": args.dtype, "op": args.op,
                       "inplace": inplace, **st, "iters": iters,
                       "algbw": case.nbytes / t / 1e9, "busbw": case.nbytes / t / 1e9 * factor,
                       "wrong": wrong[a],
                       "vs_mpi": mpi_time / float(np.median(times[a])) if mpi_time else None,
                       "bytes_sent": sent[a] if a != "mpi" else None,
                       "predicted_us": pred * 1e6 if pred is not None else None,
                       "auto_choice": chosen if a == "auto" else None}
                total_wrong += wrong[a] or 0
                records.append(rec)
                if rank == 0:
                    extra = (f" {st['time_us_min']:>9.1f} {st['time_us_max']:>9.1f} "
                             f"{st['time_us_p90']:>9.1f} {st['time_us_p99']:>9.1f}"
                             if args.full else "")
                    name = f"auto:{chosen}" if a == "auto" else a
                    sent_ratio = (f"{sent[a][0] / case.nbytes:>9.3f}" if a != "mpi" and
                                  case.nbytes else f"{'-':>9}")
                    pred_s = f"{rec['predicted_us']:>9.1f}" if pred is not None else f"{'-':>9}"
                    wrong_s = "-" if wrong[a] is None else wrong[a]
                    vs_mpi = f"{'-':>6}" if rec["vs_mpi"] is None else f"{rec['vs_mpi']:>6.2f}"
                    print(f"{case.nbytes:>10} {case.count:>9} {args.dtype:>7} {args.op:>5} "
                          f"{name:>18} {'in' if inplace else 'out':>5} | {st['time_us']:>10.1f} "
                          f"{rec['algbw']:>7.3f} {rec['busbw']:>7.3f} {wrong_s:>6} | "
                          f"{vs_mpi} {pred_s} {sent_ratio}{extra}", flush=True)
            if rank == 0 and "reproducible" in times and "auto" in times:
                print(f"# reproducible / auto at {case.nbytes} B: "
                      f"{np.median(times['reproducible']) / np.median(times['auto']):.2f}x")
    note = pred_note(profile, profile_path, pre["hosts"], crowded)
    if rank == 0 and note and any(r["predicted_us"] is not None for r in records):
        print(f"# note: {note}")
    if rank == 0:
        verdict = ("results not checked (--no-check)" if args.no_check else
                   "all results correct" if total_wrong == 0 else f"{total_wrong} WRONG elements")
        print(f"# {verdict}; {len(records)} measurements")
    return pre, records, total_wrong


def main(argv=None, comm=None) -> int:
    """``mpicoll bench``; on ``comm`` (default: a duplicate of COMM_WORLD)."""
    args = parse_args(argv if argv is not None else sys.argv[1:])
    own = comm is None
    comm = MPI.COMM_WORLD.Dup() if own else comm
    # rank 0 writes the files: check their paths before the sweep, not after it
    problems = ([p for p in map(prepare_output, filter(None, (args.json, args.csv))) if p]
                if comm.Get_rank() == 0 else None)
    problems = comm.bcast(problems, root=0)
    if problems:
        if comm.Get_rank() == 0:
            print(f"mpicoll bench: error: {problems[0]}", file=sys.stderr)
        if own:
            comm.Free()
        return 2
    pre, records, total_wrong = run(comm, args)
    if comm.Get_rank() == 0:
        if args.json:
            with open(args.json, "w") as f:
                json.dump({**pre, "records": records}, f, indent=1)
            print(f"# wrote {args.json}")
        if args.csv and records:
            with open(args.csv, "w", newline="") as f:
                w = csv.DictWriter(f, fieldnames=list(records[0]))
                w.writeheader()
                for r in records:
                    w.writerow({k: ";".join(map(str, v)) if isinstance(v, list) else v
                                for k, v in r.items()})
            print(f"# wrote {args.csv}")
    if own:
        comm.Free()
    return 1 if total_wrong else 0
