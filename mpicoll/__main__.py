"""Command line: ``mpicoll COMMAND`` or ``python -m mpicoll COMMAND``.

    bench       all algorithms against the MPI library's, OSU / nccl-tests style (under mpiexec)
    calibrate   measure alpha, beta, gamma for the cost model (under mpiexec)
    model       predicted times and crossovers from a profile, for any N (no MPI needed)
    tune        reduce a bench JSON to a decision table for algorithm="auto"
    plot        time and bus bandwidth against size from a bench JSON
    report      a bench JSON as markdown tables
    trace       print the schedule of an algorithm for N ranks (no MPI needed)
    simulate    predicted times of the schedules on a modelled fabric, up to 25,000 ranks
"""

from __future__ import annotations

import sys

COMMANDS = {name: f"mpicoll.tools.{name}"
            for name in ("bench", "calibrate", "model", "tune", "plot", "report", "trace",
                      "simulate")}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in COMMANDS:
        print(__doc__.strip())
        return 0 if argv and argv[0] in ("-h", "--help") else 2
    import importlib
    return importlib.import_module(COMMANDS[argv[0]]).main(argv[1:]) or 0


if __name__ == "__main__":
    sys.exit(main())
