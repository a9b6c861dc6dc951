"""Every ``MPICOLL_*`` environment variable, declared once (as MPICH's ``cvars.txt`` declares its
control variables): its type, default, one line of doc, and when it is read.

The library's variables (``LIBRARY``) have one caching policy: a variable is read, parsed and
checked the first time the library needs it, and the value is kept until ``reload()``. (A lookup
of an unset variable in ``os.environ`` costs about a microsecond; a collective must not pay
that on every call.) A bad value raises ``ValueError`` naming the variable, on first use::

    from mpicoll import settings
    settings.get("MPICOLL_TIMEOUT")      # seconds (default 600), or None: off
    settings.reload()                    # after changing os.environ

The variables read by the scripts (``run.sh``, ``tests/``, ``slurm/``) are declared here too
(``SCRIPTS``), so that one table documents them all; docs/reference/settings.md is generated
from both.
"""

from __future__ import annotations

import difflib
import math
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

__all__ = ["Setting", "LIBRARY", "SCRIPTS", "get", "given", "reload", "on_reload",
           "markdown_table", "update_markdown", "problems", "unknown_names", "bytes_of",
           "seconds_of"]

PROFILES = Path(__file__).with_name("profiles")


@dataclass(frozen=True)
class Setting:
    name: str
    type: str                        # what the value must be, as the docs say it
    default: Any
    doc: str
    read: str                        # when (library) or by what (scripts) it is read
    parse: Callable[[str, str], Any] | None = None   # (name, text) -> value; raises ValueError


# ----------------------------------------------------------------------------- parsers

def _positive_int(name: str, text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise ValueError(f"{name} must be a positive integer, got {text!r}")
    return value


_BYTES = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
_TIMES = {"": 1.0, "s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9, "m": 60.0,
          "min": 60.0, "h": 3600.0}


def bytes_of(text: str) -> float:
    """Bytes in ``text``: ``8``, ``64K``, ``4M``, ``1.5G``, ``4MB`` (powers of 1024, as the
    command line's sizes, ``mpicoll.tools.sizes``); ``ValueError`` if it is none."""
    body = str(text).strip().upper().removesuffix("B")
    unit = body[-1:] if body[-1:] in _BYTES else ""
    try:
        value = float(body[:len(body) - len(unit)]) * _BYTES[unit]
    except ValueError:
        value = -1.0
    if not 0 <= value < math.inf:
        raise ValueError(f"not a size: {text!r} (expected bytes like 8, 64K, 4M or 1G)")
    return value


def seconds_of(text: str) -> float:
    """Seconds in ``text``: ``600``, ``10m``, ``1.5h``, ``30s``, ``500ms``, ``inf``; a bare
    number is seconds. ``ValueError`` if it is none."""
    body = str(text).strip()
    unit = body.lstrip("0123456789.eE+-").strip() if body.lower() != "inf" else ""
    number = body[:len(body) - len(unit)].strip() if unit else body
    try:
        value = float(number) * _TIMES[unit]
    except (ValueError, KeyError):
        value = math.nan
    if not value >= 0:
        raise ValueError(f"not a time: {text!r} (expected seconds like 600, 10m, 1h or 500ms)")
    return value


def _nonnegative_int(name: str, text: str) -> int:
    try:
        value = bytes_of(text)
    except ValueError:
        value = -1
    if value < 0 or value != int(value):
        raise ValueError(f"{name} must be a number of bytes (an integer >= 0, or with a suffix "
                         f"as 64K, 1M, 1G), got {text!r}")
    return int(value)


def _seconds(name: str, text: str) -> float | None:
    """Seconds > 0 (``10m``, ``1h`` ... as ``seconds_of``); ``0`` or ``inf``: no timeout (None)."""
    try:
        value = seconds_of(text)
    except ValueError:
        try:
            shown = float(text)
        except ValueError:
            shown = text
        raise ValueError(f"{name} must be a number of seconds > 0, or 0 or inf for no timeout, "
                         f"got {shown!r} (a unit may follow the number: 10m, 1h, 500ms)") from None
    return None if value in (0, math.inf) else value


def _choice(*choices: str) -> Callable[[str, str], str]:
    def parse(name: str, text: str) -> str:
        if text not in choices:
            raise ValueError(f"{name} must be " + " or ".join(repr(c) for c in choices)
                             + f", got {text!r}")
        return text
    return parse


def _flag(name: str, text: str) -> bool:
    if text not in ("0", "1"):
        raise ValueError(f"{name} must be 0 or 1, got {text!r}")
    return text == "1"


def _existing_file(name: str, text: str) -> Path:
    path = Path(text)
    if not path.is_file():
        raise ValueError(f"{name}={text}: no such file")
    return path


def _algorithm_name(name: str, text: str) -> str:
    if not text.replace("_", "").isalnum():
        raise ValueError(f"{name} must name an algorithm, got {text!r}")
    return text


# ----------------------------------------------------------------------------- the table

# The default deadline of every collective (MPICOLL_TIMEOUT): as PyTorch's NCCL process groups
# (10 min; Gloo's: 30 min). Generous: far above any one collective's time on a working job
# (seconds at most), so it fires only on a hang -- a missing, dead or mismatched rank -- and
# reports it instead of waiting forever. Jobs whose ranks legitimately wait longer in a call
# (one rank reading a data set while the others wait in its bcast) set it higher, or 0 (off).
DEFAULT_TIMEOUT = 600.0

LIBRARY = (
    Setting("MPICOLL_TIMEOUT", "seconds > 0 (or 10m, 1h, 500ms); 0 or inf: none", DEFAULT_TIMEOUT,
            "every collective raises `CollectiveTimeout` naming the missing ranks (or "
            "`ArgumentMismatch` naming who passed what) after s seconds; the default is generous, "
            "as PyTorch's process groups' (docs/reliability.md)", "first collective call",
            _seconds),
    Setting("MPICOLL_ON_TIMEOUT", "exception | abort", "exception",
            "what a timeout does: raise, or print the error and call `MPI_Abort` so the job ends",
            "first collective call", _choice("exception", "abort")),
    Setting("MPICOLL_VALIDATE", "0 | 1", False,
            "one agreement step first: mismatched count/dtype/op/algorithm/root raise "
            "`ArgumentMismatch` on every rank", "first collective call", _flag),
    Setting("MPICOLL_RANKS_PER_NODE", "integer >= 1", None,
            "node-aware algorithms (`hierarchical`) see virtual nodes of k consecutive ranks "
            "instead of the `COMM_TYPE_SHARED` split", "first node-aware call on a communicator",
            _positive_int),
    Setting("MPICOLL_HIER_INNER", "ring | recursive_halving | binomial", None,
            "`hierarchical`'s node-local algorithm (default: ring on equal nodes, else binomial)",
            "first `hierarchical` call", _algorithm_name),
    Setting("MPICOLL_HIER_OUTER", "an all-reduce algorithm", "recursive_doubling",
            "`hierarchical`'s inter-node all-reduce", "first `hierarchical` call",
            _algorithm_name),
    Setting("MPICOLL_RING_ORDER", "rank | node | rail", None,
            "the order `ring` visits the ranks (default: rank; `auto` runs node order when the "
            "ranks span nodes)", "first ring call", _choice("rank", "node", "rail")),
    Setting("MPICOLL_TUNING", "path of a JSON file", PROFILES / "tuning.json",
            "the decision table `auto` consults first (`mpicoll tune` writes one)",
            "first `auto` decision", _existing_file),
    Setting("MPICOLL_PROFILE", "path of a JSON file", PROFILES / "default.json",
            "the cost-model profile `auto` and `model` use (`mpicoll calibrate` writes one)",
            "first `auto` decision or prediction", _existing_file),
    Setting("MPICOLL_SHORT_MSG", "bytes (or 8K, 1M)", 8192,
            "`auto`'s last resort, MPICH's rule: recursive doubling up to this size",
            "first `auto` decision", _nonnegative_int),
    Setting("MPICOLL_EXECUTOR", "python | compiled", None,
            "force the executor: the Python step loop over mpi4py, or the numba-compiled loop "
            "calling libmpi (unset: compiled where it can run, else Python with a notice; "
            "docs/performance.md)", "first collective call", _choice("python", "compiled")),
    Setting("MPICOLL_SEGMENT_BYTES", "bytes (or 1M ...; 0: never)", None,
            "the compiled executor splits messages into segments of at most this many bytes and "
            "pipelines each step's transfers with its reductions (unset: the cost model's "
            "optimum, 1-4 MiB, messages under 2 MiB not split; must be the same on every rank; "
            "docs/performance.md)", "first collective call", _nonnegative_int),
    Setting("MPICOLL_KERNELS", "numba | numpy", "numba",
            "the reduction kernels: numba's (default) or numpy's ufuncs (same bits)",
            "first reduction", _choice("numba", "numpy")),
    Setting("MPICOLL_SHM_SINGLE_COPY", "auto | on | off", "auto",
            "`shm` from 16 KiB reads the other ranks' buffers where they are (Linux "
            "`process_vm_readv`) if every rank can (a probe when the window is made): `on` "
            "always, `auto` when the node has a core per rank, `off` never (copies through the "
            "window)", "each new `shm` window", _choice("auto", "on", "off")),
    Setting("MPICOLL_PROGRESS", "auto | thread | caller", "auto",
            "who moves nonblocking collectives: a progress thread (needs `MPI_THREAD_MULTIPLE`; "
            "`auto` picks it when the MPI library gives that level) or the caller, in `test`/`wait`",
            "first nonblocking call", _choice("auto", "thread", "caller")),
    Setting("MPICOLL_YIELD_WHEN_IDLE", "auto | 0 | 1", "auto",
            "whether waits spin (as Open MPI's `mpi_yield_when_idle`): `1` never (a `shm` flag "
            "wait naps on a futex after 20 us, the progress thread sleeps at once, waits on MPI "
            "requests nap 10 us), `0` as on a quiet node (spin up to 2 ms: the fastest where "
            "nothing else runs on the node), `auto` never when this node's ranks outnumber the "
            "cores this process may run on", "first wait", _choice("auto", "0", "1")),
    Setting("MPICOLL_HEARTBEAT", "seconds (or 200ms); 0: off", 0.2,
            "the failure detector's period: a rank that dies is named on every survivor "
            "(`ProcessFailed`) within about a period on its machine, within "
            "`MPICOLL_HEARTBEAT_TIMEOUT` plus a period across machines (docs/reliability.md)",
            "each communicator's set-up", _seconds),
    Setting("MPICOLL_HEARTBEAT_TIMEOUT", "seconds (or 1500ms)", 1.5,
            "a rank on another machine whose heartbeats stop this long is taken for dead "
            "(ranks on this machine are checked directly: a busy one is never taken for dead)",
            "each communicator's set-up", _seconds),
    Setting("MPICOLL_HEARTBEAT_ONLY", "0 | 1", False,
            "`1`: ranks on one machine watch each other by heartbeats too, as ranks on other "
            "machines do (how the tests exercise the cross-machine detector on one machine)",
            "each communicator's set-up", _flag),
    Setting("MPICOLL_STRAGGLERS", "path of a JSON file", None,
            "at exit, rank 0 writes `mpicoll.stats(MPI.COMM_WORLD)` there: the straggler and "
            "how long the others waited for each rank (`mpicoll report` prints it)",
            "at exit", lambda name, text: Path(text)),
    Setting("MPICOLL_BACKGROUND_START", "0 | 1", True,
            "`1` (the default): a nonblocking call on a communicator mpicoll has not set up yet "
            "returns at once (its `MPI_Comm_idup` started in its place) and a background thread "
            "finishes the set-up (docs/reliability.md; MPICH only: off under Open MPI, which "
            "failed with it; needs the progress thread); `0`: it sets the communicator up "
            "first, as a blocking call (then a rank that starts it and waits for another "
            "rank's message before the other starts it deadlocks)",
            "each nonblocking call", _flag),
)

SCRIPTS = (
    Setting("MPICOLL_VENV", "path", ".venv", "the virtual environment run.sh creates and uses",
            "run.sh"),
    Setting("MPICOLL_PIP_EXTRAS", "comma list", "mpich,test",
            "the extras run.sh installs (leave out `mpich` to use a site MPI's mpi4py)", "run.sh"),
    Setting("MPICOLL_NP", "integer", 4, "ranks of `bash run.sh bench`", "run.sh"),
    Setting("MPICOLL_TEST_RANKS", "space list", "1 2 3 4 5",
            "the `mpiexec -n` runs of the MPI suite (CI=true adds 8)", "tests/run.sh"),
    Setting("MPICOLL_TEST_VERBOSE", "0 | 1", 0, "full pytest output from every rank, not rank 0 "
            "only", "tests/mpi/conftest.py"),
    Setting("MPICOLL_SKIP_OPENMPI", "0 | 1", 0, "skip the Open MPI leg (and its environment, "
            "`.venv-openmpi`) of `bash run.sh test`; ignored under CI=true", "run.sh, tests/run.sh"),
    Setting("MPICOLL_SKIP_TORCH", "0 | 1", 0, "skip the PyTorch leg (and its environment, "
            "`.venv-torch`) of `bash run.sh test`; ignored under CI=true",
            "run.sh, tests/run-torch.sh"),
    Setting("MPICOLL_TORCH_LEG", "0 | 1", 0, "set by `bash run.sh test` when it installs "
            "`.venv-torch`: tests/run.sh then runs the PyTorch leg beside its Slurm stage",
            "run.sh, tests/run.sh"),
    Setting("MPICOLL_LEG_INSTALLS", "folder", "", "set by `bash run.sh test`: where its "
            "background installs of `.venv-openmpi` and `.venv-torch` write NAME.log, then "
            "NAME.status (the exit status); tests/run.sh waits for each before its stage",
            "run.sh, tests/run.sh"),
    Setting("MPICOLL_SKIP_SLURM", "0 | 1", 0, "skip the Slurm integration tests",
            "tests/run-slurm.sh"),
    Setting("MPICOLL_REQUIRE_SLURM", "0 | 1", 0,
            "fail, not skip, when the local Slurm cluster cannot run (.ci/run sets it)",
            "tests/run-slurm.sh"),
    Setting("MPICOLL_SLURM_CLUSTER", "local | reachable", "local",
            "`reachable`: run the Slurm tests on the cluster `sinfo` already reaches, not on the "
            "local one the tests start", "tests/run-slurm.sh"),
    Setting("MPICOLL_SLURM_DIR", "path", "/tmp/mpicoll-slurm",
            "state, logs and configuration of the local Slurm cluster",
            "slurm/local-cluster.sh, tests/run-slurm.sh"),
    Setting("MPICOLL_SLURM_PORT", "integer", 16817, "first of the 3 ports of the local cluster's daemons",
            "slurm/local-cluster.sh"),
    Setting("MPICOLL_SLURM_CPUS", "integer", 2, "CPUs each emulated node declares",
            "slurm/local-cluster.sh"),
    Setting("MPICOLL_FABRIC", "name", "", "set by `local-cluster.sh up --fabric` (its export "
            "line and every task): the shaped fabric the cluster runs on; the fabric test runs "
            "only where it is set (docs/fabric.md)", "slurm/local-cluster.sh, tests/slurm"),
    Setting("MPICOLL_SLURM_SBATCH_ARGS", "words", "", "extra sbatch options of the Slurm tests "
            "(e.g. `-p debug -A project`)", "tests/slurm"),
    Setting("MPICOLL_SLURM_TIMEOUT", "seconds", 60, "how long the local cluster waits for its nodes",
            "slurm/local-cluster.sh"),
    Setting("MPICOLL_SLURM_JOB_TIMEOUT", "seconds", 600, "how long a Slurm test waits for its job",
            "tests/slurm"),
    Setting("MPICOLL_SLURM_MIN_JOB_AGE", "seconds", 300, "how long slurmctld keeps finished jobs",
            "slurm/local-cluster.sh"),
    Setting("MPICOLL_LAUNCHER", "srun | mpiexec", "srun", "how the sbatch scripts start ranks",
            "slurm/common.sh"),
    Setting("MPICOLL_LAUNCHER_ARGS", "words", "", "extra srun / mpiexec arguments",
            "slurm/common.sh"),
    Setting("MPICOLL_PMI", "pmi2 | pmix | ...", None, "the `srun --mpi=` plugin (default: "
            "from the MPI library)", "slurm/common.sh"),
    Setting("MPICOLL_PYTHON", "path", None, "the interpreter of the sbatch scripts",
            "slurm/common.sh"),
    Setting("MPICOLL_ROOT", "path", None, "the checkout the sbatch scripts run from",
            "slurm/common.sh"),
    Setting("MPICOLL_RESULTS", "path", "results", "where the sbatch scripts' results go",
            "slurm/common.sh"),
    Setting("MPICOLL_BENCH_ARGS", "words", None, "bench arguments of the sbatch scripts",
            "slurm/*.sbatch"),
    Setting("MPICOLL_COLLECTIVES", "comma list | all", "allreduce",
            "what slurm/bench.sbatch measures", "slurm/bench.sbatch"),
    Setting("MPICOLL_SWEEP", "';' list", "-m 8:4K;-m 16K:1M;-m 4M:64M", "the sizes of slurm/sweep.sbatch",
            "slurm/sweep.sbatch"),
    Setting("MPICOLL_SCALING_ARGS", "words", None, "arguments of jobs/experiments/scaling.py in "
            "slurm/scaling.sbatch", "slurm/scaling.sbatch"),
    Setting("MPICOLL_FAULT_ARGS", "words", "--reps 20", "arguments of "
            "jobs/experiments/fault_matrix.py in slurm/fault_matrix.sbatch",
            "slurm/fault_matrix.sbatch"),
    Setting("MPICOLL_REPRODUCE_TUNED", "0 | 1", "1", "`0`: fabric-reproduce.sh skips the tuned "
            "table and its second bench run at 1 Gbit/s", "slurm/local/fabric-reproduce.sh"),
    Setting("MPICOLL_HARNESS_CASE", "name", None, "which deliberate failure the harness tests "
            "run", "tests/mpi/deliberately_failing.py"),
)

_BY_NAME = {s.name: s for s in LIBRARY}
_values: dict[str, Any] = {}
_listeners: list[Callable[[], None]] = []


def get(name: str) -> Any:
    """The value of a library setting: parsed and checked on first use, then cached."""
    try:
        return _values[name]
    except KeyError:
        pass
    if not _values and not _warned:
        _warn_unknown()
    setting = _BY_NAME[name]
    text = os.environ.get(name, "")
    value = setting.parse(name, text) if text else setting.default
    _values[name] = value
    return value


def given(name: str) -> bool:
    """Whether the environment sets library setting ``name`` (a value, not its default: a
    tuned row's option yields to the user's setting only)."""
    get(name)                           # (parsed and checked as on any use)
    return bool(os.environ.get(name, ""))


def problems() -> list[str]:
    """What is wrong with the ``MPICOLL_*`` variables set now: one line for each library
    setting whose value would raise on first use (tools check them all before they start, so
    a bad value is a one-line error, not a traceback from inside the first collective)."""
    found = []
    for setting in LIBRARY:
        text = os.environ.get(setting.name, "")
        if text:
            try:
                setting.parse(setting.name, text)
            except ValueError as e:
                found.append(str(e))
    return found


def unknown_names(environ=None) -> list[tuple[str, str | None]]:
    """``(name, closest known name or None)`` for each ``MPICOLL_*`` variable in ``environ``
    (default ``os.environ``) that no table here declares: most likely a misspelling."""
    known = [s.name for s in LIBRARY + SCRIPTS]
    environ = os.environ if environ is None else environ
    tails = {name[8:]: name for name in known}          # compared without MPICOLL_
    return [(name, tails.get(next(iter(difflib.get_close_matches(name[8:], tails, n=1,
                                                                 cutoff=0.6)), None)))
            for name in sorted(environ) if name.startswith("MPICOLL_") and name not in known]


_warned = False


def _warn_unknown() -> None:
    """One line on stderr for each unknown ``MPICOLL_*`` name, from one process of a job (the
    launcher's rank 0, or a process started without one), the first time a setting is read."""
    global _warned
    _warned = True
    rank = next((os.environ[v] for v in ("PMI_RANK", "PMIX_RANK", "OMPI_COMM_WORLD_RANK",
                                         "SLURM_PROCID") if os.environ.get(v, "").isdigit()), "0")
    if rank != "0":
        return
    for name, close in unknown_names():
        hint = (f"; did you mean {close}?" if close else
                " (docs/reference/settings.md lists them)")
        print(f"mpicoll: warning: {name} is not an mpicoll setting, ignored{hint}",
              file=sys.stderr, flush=True)


def reload() -> None:
    """Forget every cached value (and what was derived from them); read again on next use."""
    global _warned
    _warned = False
    _values.clear()
    for listener in _listeners:
        listener()


def on_reload(fn: Callable[[], None]) -> Callable[[], None]:
    """Register ``fn`` to run at ``reload()`` (caches derived from settings clear themselves)."""
    _listeners.append(fn)
    return fn


def markdown_table(settings=LIBRARY) -> str:
    """The README's table of ``settings``."""
    def default(s):
        if s.default is None or s.default == "":
            return "unset"
        if isinstance(s.default, Path):
            return f"shipped `{s.default.parent.name}/{s.default.name}`"
        if isinstance(s.default, bool):
            return str(int(s.default))
        return f"`{s.default}`"
    rows = ["| variable | value | default | effect | read |", "|---|---|---|---|---|"]
    rows += [f"| `{s.name}` | {s.type.replace('|', '&#124;')} | {default(s)} | {s.doc} | {s.read} |"
             for s in settings]
    return "\n".join(rows) + "\n"



def update_markdown(path) -> None:
    """Rewrite the ``<!-- settings: library|scripts -->`` blocks of a markdown file (docs/reference/settings.md)."""
    text = Path(path).read_text()
    for which, table in (("library", LIBRARY), ("scripts", SCRIPTS)):
        text = re.sub(rf"(<!-- settings: {which} -->\n).*?(<!-- end settings -->)",
                      lambda m, t=table: m[1] + markdown_table(t) + m[2], text, flags=re.S)
    Path(path).write_text(text)
