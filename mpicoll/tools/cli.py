"""What every command shares: a parser whose errors are one line (exit status 2), help that
shows each option's default, argument types that reject bad numbers, bench JSON reading and
output paths checked before the work starts."""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from pathlib import Path

from ..settings import problems, seconds_of

__all__ = ["Parser", "plain", "positive_int", "nonnegative_int", "nonnegative_float",
           "step_factor", "seconds_arg", "read_bench_json", "prepare_output", "check_settings"]


def plain(text: str) -> str:
    """Docstring text for a terminal: reST's ``x`` written as x."""
    return re.sub(r"``(.+?)``", r"\1", text, flags=re.S)


class _Help(argparse.RawDescriptionHelpFormatter):
    """Keeps the description's line breaks; adds "(default: X)" where an option has a default
    its help does not already give."""

    def _get_help_string(self, action):
        text = action.help or ""
        shown = not (action.default is None or action.default is False
                     or action.default is argparse.SUPPRESS)
        if shown and action.option_strings and "default" not in text:
            text += " (default: %(default)s)"
        return text


class Parser(argparse.ArgumentParser):
    """``argparse.ArgumentParser`` with one-line errors: ``mpicoll X: error: ...``, exit 2.

    Under MPI only rank 0 prints: every rank parses the same command line and fails alike.
    """

    def __init__(self, prog: str, doc: str, **kwargs):
        super().__init__(prog=prog, description=plain(doc).strip(), formatter_class=_Help,
                         **kwargs)

    def error(self, message: str):
        if _rank() == 0:
            print(f"{self.prog}: error: {message}", file=sys.stderr)
        sys.exit(2)

    def print_help(self, file=None):
        if _rank() == 0:
            super().print_help(file)


def _rank() -> int:
    """This process's rank in COMM_WORLD if MPI is running, else the rank its launcher gave it
    (mpiexec, srun), else 0; never initialises MPI."""
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is not None and mpi.Is_initialized() and not mpi.Is_finalized():
        return mpi.COMM_WORLD.Get_rank()
    for name in ("PMI_RANK", "PMIX_RANK", "OMPI_COMM_WORLD_RANK"):
        if os.environ.get(name, "").isdigit():
            return int(os.environ[name])
    return 0


def _number(kind, test, what):
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            value = None
        if value is None or not test(value):
            raise argparse.ArgumentTypeError(f"must be {what}, got {text!r}")
        return value
    parse.__name__ = what
    return parse


positive_int = _number(int, lambda v: v >= 1, "a positive integer")
nonnegative_int = _number(int, lambda v: v >= 0, "an integer >= 0")
nonnegative_float = _number(float, lambda v: 0 <= v < float("inf"), "a number >= 0")
step_factor = _number(float, lambda v: 1 <= v < float("inf"), "a number >= 1")


def seconds_arg(text: str) -> float:
    """Seconds >= 0 as the environment takes them (``300``, ``10m``, ``1h``, ``500ms``;
    ``mpicoll.settings.seconds_of``)."""
    try:
        return seconds_of(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


seconds_arg.__name__ = "a time"


def check_settings(ap: Parser) -> None:
    """A one-line usage error for the first bad ``MPICOLL_*`` value (commands that run
    collectives check them before starting, not inside the first call on every rank)."""
    found = problems()
    if found:
        ap.error(found[0])


def read_bench_json(path: str, simulated: bool = False) -> dict:
    """The results in a JSON file written by ``mpicoll bench --json``; ``ValueError`` naming the
    file and what is missing if it is not one. ``simulated``: also take what ``mpicoll
    simulate --json`` writes (bench's keys, times from the simulator)."""
    try:
        results = json.loads(Path(path).read_text())
    except (OSError, ValueError) as e:
        raise ValueError(f"{path}: cannot read bench results: {e}") from None
    need = ("algorithm", "size", "inplace", "time_us")
    if not isinstance(results, dict) or not isinstance(results.get("records"), list) \
            or not results["records"] or not isinstance(results.get("nranks"), int) \
            or "nodes" not in results:
        raise ValueError(f"{path}: not bench results (expected the JSON object that "
                         "`mpicoll bench --json` writes: nranks, nodes and a non-empty list "
                         "of records)")
    for i, record in enumerate(results["records"]):
        missing = [k for k in need if not isinstance(record, dict) or k not in record]
        if missing:
            raise ValueError(f"{path}: record {i} is not a bench record: no {', '.join(missing)}")
    if not simulated and isinstance(results.get("fabric"), dict):   # (the simulator's fabric;
        # a bench on a shaped fabric names its fabric, jobs/experiments/fabric_bench.py)
        raise ValueError(f"{path}: simulator results (mpicoll simulate --json), not measured "
                         f"ones: this command reads what `mpicoll bench --json` writes")
    return results


def prepare_output(path: str, create: bool = True) -> str | None:
    """Check the file ``path`` can be written; ``create``: make its folder if it is missing
    (bench, calibrate and simulate make their results folder; plot and tune do not).

    Returns None if it can, else the reason in one line; writes no file."""
    target = Path(path)
    if not create and not target.parent.is_dir():
        what = "is a file, not a folder" if target.parent.exists() else "does not exist"
        return f"{path}: the folder {target.parent} {what}"
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        return f"{path}: {target.parent} is a file, not a folder"
    except OSError as e:
        return f"{path}: cannot create the folder {target.parent}: {e.strerror or e}"
    if target.is_dir():
        return f"{path} is a folder, not a file"
    writable = os.access(target if target.exists() else target.parent, os.W_OK)
    return None if writable else f"{path}: not writable"
