"""Command line: mpicoll COMMAND [options], or python -m mpicoll COMMAND; mpicoll COMMAND -h
for a command's options, mpicoll --version for the version.

    bench       all algorithms against the MPI library's, OSU / nccl-tests style (under mpiexec)
    calibrate   measure alpha, beta, gamma for the cost model (under mpiexec)
    model       predicted times and crossovers from a profile, for any N (no MPI needed)
    tune        reduce bench JSON files to a decision table for algorithm="auto"
    plot        time and bus bandwidth against size from a bench JSON
    report      a bench JSON as markdown tables
    trace       print the schedule of an algorithm for N ranks (no MPI needed)
    simulate    predicted times of the schedules on a modelled fabric, up to 25,000 ranks
    survive     run one rank so that its death does not end the others (mpiexec ... mpicoll survive python train.py)

Only bench and calibrate initialise MPI; the other commands (and -h, --version) never do.
"""

from __future__ import annotations

import importlib
import os
import sys

import mpi4py

from . import __version__

COMMANDS = {name: f"mpicoll.tools.{name}"
            for name in ("bench", "calibrate", "model", "tune", "plot", "report", "trace",
                         "simulate", "survive")}
NEEDS_MPI = ("bench", "calibrate")


def _without_mpi() -> None:
    """Let mpi4py.MPI be imported (the library does) without initialising or finalising MPI: on
    a login node a site MPI can be slow to start or refuse to. No effect once it is loaded."""
    if "mpi4py.MPI" not in sys.modules:
        mpi4py.rc.initialize = False
        mpi4py.rc.finalize = False


def main(argv: list[str] | None = None) -> int:
    """``mpicoll ARGV``; without ``argv`` it is the program (``sys.argv``), and only then does
    it keep MPI uninitialised for the commands that need none: a caller passing ``argv`` may
    still want MPI in its process afterwards."""
    if argv is None:
        argv = sys.argv[1:]
        command = argv[0] if argv else None
        if command not in NEEDS_MPI or "-h" in argv or "--help" in argv:
            _without_mpi()
    command = argv[0] if argv else None
    if command in ("-h", "--help"):
        print(__doc__.strip())
        return 0
    if command == "--version":
        print(f"mpicoll {__version__}")
        return 0
    if command not in COMMANDS:
        problem = "no command given" if command is None else f"unknown command {command!r}"
        print(f"mpicoll: {problem}; expected one of: {', '.join(COMMANDS)} "
              "(mpicoll --help says what each does)", file=sys.stderr)
        return 2
    try:
        return importlib.import_module(COMMANDS[command]).main(argv[1:]) or 0
    except BrokenPipeError:
        # the reader left (mpicoll report R.json | head): stop quietly, as a killed writer
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141          # 128 + SIGPIPE, what a shell reports for such a writer


if __name__ == "__main__":
    sys.exit(main())
