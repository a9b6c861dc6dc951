"""What the labs (``jobs/lab_*.py``) share: options, JSON, the PNG, the closing claim line.

Every lab prints the seed's figure beside ours and ends with one line
``<lab>: seed <claim> | ours <value>``; ``--json FILE`` writes what it measured and ``--png FILE``
its plot (where one fits). No MPI here: the labs that need it import mpi4py themselves.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import sys
from pathlib import Path

from _figure import save_figure  # noqa: F401 -- (re-exported: the labs import it from here)

__all__ = ["parser", "write_json", "save_figure", "claim", "crossover", "BLOCK", "SUMMARY",
           "fill", "update", "recorded"]


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


# docs/labs.md quotes each lab's printed output, recorded by docs/make-labs.sh in
# docs/labs/NAME.txt: a block between ``<!-- lab: NAME -->`` and ``<!-- end lab -->`` is that file, and the block
# between ``<!-- lab summary -->`` and ``<!-- end lab summary -->`` tabulates every lab's last line.
BLOCK = re.compile(r"(<!-- lab: (?P<name>[\w.-]+) -->\n)(?P<body>.*?)(<!-- end lab -->)", re.S)
SUMMARY = re.compile(r"(<!-- lab summary -->\n)(?P<body>.*?)(<!-- end lab summary -->)", re.S)
CLAIM = re.compile(r"^(?P<lab>\w+): seed (?P<seed>.*?) \| ours (?P<ours>.*)$")


def recorded(outdir: Path, name: str) -> str:
    """A lab's recorded output, without the ``# wrote FILE`` lines."""
    text = (Path(outdir) / f"{name}.txt").read_text()
    return "".join(line for line in text.splitlines(keepends=True)
                   if not line.startswith("# wrote "))


def fill(markdown: str, outdir: Path) -> str:
    """``markdown`` with every lab block and the summary table made current."""
    def block(m):
        return m.group(1) + "```\n" + recorded(outdir, m["name"]) + "```\n" + m.group(4)

    text = BLOCK.sub(block, markdown)
    rows = ["| lab | the seed | ours |", "|---|---|---|"]
    for name in dict.fromkeys(m["name"] for m in BLOCK.finditer(text)):
        last = recorded(outdir, name).rstrip("\n").splitlines()[-1]
        m = CLAIM.match(last)
        if m:
            rows.append(f"| `{m['lab']}` | {m['seed']} | {m['ours']} |")
    return SUMMARY.sub(lambda m: m.group(1) + "\n".join(rows) + "\n" + m.group(3), text)


def update(path: Path, outdir: Path) -> bool:
    """Rewrite a markdown file's lab blocks from ``outdir``; True if it changed."""
    old = Path(path).read_text()
    new = fill(old, outdir)
    Path(path).write_text(new)
    return new != old


def mpiexec() -> str | None:
    """The launcher a lab starts its MPI part with: the one beside this Python (a venv's MPICH
    wheel), else the first on PATH; None if there is none."""
    return shutil.which("mpiexec", path=os.pathsep.join(
        [str(Path(sys.executable).parent), os.environ.get("PATH", "")]))


def crossover(sizes: list[int], ring: list[float], trees: list[list[float]]) -> int | None:
    """Smallest size from which ring is faster than every tree at every larger size."""
    wins = [r < min(t) for r, *t in zip(ring, *trees)]
    if not wins or not wins[-1]:
        return None
    i = len(wins) - 1
    while i > 0 and wins[i - 1]:
        i -= 1
    return sizes[i]


if __name__ == "__main__":          # python jobs/lab_common.py docs/labs.md docs/labs
    changed = update(Path(sys.argv[1]), Path(sys.argv[2]))
    print(f"{sys.argv[1]}: {'updated' if changed else 'already current'}")

