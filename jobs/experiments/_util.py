"""What the experiments in jobs/experiments/ share: the output directory, rank-0 output, JSON, plots.

Every experiment is a script run on all ranks, e.g.
``mpiexec -n 4 python -m mpi4py jobs/experiments/bench_sweep.py --outdir results/x``
(``python -m mpi4py`` turns an exception on one rank into MPI_Abort of the whole job).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from mpi4py import MPI

# (re-exported: the experiments import it from here)
from mpicoll.tools.plot import save_figure  # noqa: F401

RANK = MPI.COMM_WORLD.Get_rank()


def parser(doc: str) -> argparse.ArgumentParser:
    """An argument parser with --outdir; other options go to ``parse_known_args``'s rest."""
    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0], allow_abbrev=False,
                                 epilog="Other options are passed to `mpicoll bench`.")
    ap.add_argument("--outdir", type=Path, default=Path("results"),
                    help="directory for JSON and plots (default: results/)")
    return ap


def outdir(path: Path) -> Path:
    """Create the output directory (every rank: it may be node-local storage)."""
    path.mkdir(parents=True, exist_ok=True)
    return path


def say(*args) -> None:
    if RANK == 0:
        print(*args, flush=True)


def write_json(path: Path, data) -> None:
    path.write_text(json.dumps(data, indent=1) + "\n")
    print(f"# wrote {path}", flush=True)


def bench_plot(json_path: Path, png_path: Path, title: str | None = None) -> None:
    """``mpicoll plot`` of a bench JSON (rank 0 only)."""
    try:
        from mpicoll.tools.plot import plot
        for size, old, new in plot(json.loads(json_path.read_text()), str(png_path), title):
            print(f"# crossover: {new} overtakes {old} at {size} B")
        print(f"# wrote {png_path}", flush=True)
    except ImportError:
        print(f"# no matplotlib: skipped {png_path} (pip install matplotlib)", file=sys.stderr)
