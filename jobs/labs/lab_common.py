"""What the labs (``jobs/labs/lab_*.py``) share: options, JSON, the PNG, the closing claim line.

Every lab prints the seed's figure beside ours and ends with one line
``<lab>: seed <claim> | ours <value>``; ``--json FILE`` writes what it measured and ``--png FILE``
its plot (where one fits). No MPI here: the labs that need it import mpi4py themselves.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from pathlib import Path

# (re-exported: the labs import them from here)
from mpicoll.tools.plot import crossover, save_figure  # noqa: F401

__all__ = ["parser", "write_json", "save_figure", "claim", "crossover", "mpiexec"]


def parser(doc: str, png: str | None = None) -> argparse.ArgumentParser:
    """An argument parser with ``--json FILE`` and, for a lab with a plot, ``--png FILE``."""
    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0], allow_abbrev=False)
    ap.add_argument("--json", type=Path, metavar="FILE", help="write the results as JSON")
    if png:
        ap.add_argument("--png", type=Path, metavar="FILE", default=None,
                        help=f"write the plot ({png})")
    return ap


def write_json(path: Path | None, data) -> None:
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(data, indent=1) + "\n")
        print(f"# wrote {path}", flush=True)


def claim(lab: str, seed: str, ours: str) -> str:
    """The closing line of a lab."""
    line = f"{lab}: seed {seed} | ours {ours}"
    print(line, flush=True)
    return line


def mpiexec() -> str | None:
    """The launcher a lab starts its MPI part with: the one beside this Python (a venv's MPICH
    wheel), else the first on PATH; None if there is none."""
    return shutil.which("mpiexec", path=os.pathsep.join(
        [str(Path(sys.executable).parent), os.environ.get("PATH", "")]))
