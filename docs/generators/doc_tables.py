"""The measured tables of docs/results.md, performance.md and training.md, remade from their JSON.

    python docs/generators/doc_tables.py docs/performance.md            # rewrite the blocks in place
    python docs/generators/doc_tables.py --check docs/*.md              # exit 1 naming each stale block

A measured table sits between two comments that name the command printing it from committed
data (a JSON in docs/results/; no MPI, no timing, so the same data always gives the same text):

    <!-- table: python docs/generators/perf_tables.py --runs docs/results/perf-np2-1.json ... -->
    ... the command's output ...
    <!-- end table -->

``<!-- table: NAME -->`` is short for ``python -m mpicoll report docs/results/NAME.json``;
``<!-- file: PATH -->`` quotes the file PATH in a code block. The commands run from the
repository's root, with bash (so ``{1,2,3}`` expands). A table that is not a measurement (a
mapping, a list of options) is marked ``<!-- not measured -->`` on the line above it;
``unsourced(text)`` lists the tables that are neither, which tests/unit/test_doc_tables.py
refuses.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BLOCK = re.compile(r"(^<!-- (?P<kind>table|file): (?P<arg>[^\n]*?) -->\n)(?P<body>.*?)"
                   r"(^<!-- end (?P=kind) -->)", re.S | re.M)
NOT_MEASURED = "<!-- not measured -->"

__all__ = ["BLOCK", "command_of", "render", "fill", "stale", "unsourced"]


def command_of(kind: str, arg: str) -> str:
    """The shell command a block's text is the output of."""
    if kind == "file":
        return f"cat {arg}"
    if " " not in arg:                          # NAME: mpicoll report on docs/results/NAME.json
        return f"python -m mpicoll report docs/results/{arg}.json"
    return arg


def render(kind: str, arg: str) -> str:
    """The block's text today: the command's output (a file in a code block)."""
    if kind == "file":
        return "```\n" + (ROOT / arg).read_text() + "```\n"
    cmd = command_of(kind, arg)
    cmd = re.sub(r"^python\b", lambda m: sys.executable, cmd)
    proc = subprocess.run(cmd, shell=True, executable="/bin/bash", cwd=ROOT, capture_output=True,
                          text=True, timeout=300,
                          env=dict(os.environ, PYTHONPATH=str(ROOT)))
    if proc.returncode:
        raise RuntimeError(f"{command_of(kind, arg)} failed: {proc.stderr.strip()[-500:]}")
    return proc.stdout if proc.stdout.endswith("\n") else proc.stdout + "\n"


def fill(text: str) -> str:
    """``text`` with every block remade."""
    return BLOCK.sub(lambda m: m.group(1) + render(m["kind"], m["arg"]) + m.group(5), text)


def stale(text: str) -> list[str]:
    """The commands of the blocks whose text is not what they print today."""
    return [command_of(m["kind"], m["arg"]) for m in BLOCK.finditer(text)
            if render(m["kind"], m["arg"]) != m["body"]]


def unsourced(text: str) -> list[int]:
    """Line numbers (1-based) of markdown tables that are neither in a block nor marked
    ``<!-- not measured -->``."""
    inside = set()
    for m in BLOCK.finditer(text):
        first = text.count("\n", 0, m.start()) + 1
        inside.update(range(first, first + m.group(0).count("\n") + 1))
    lines = text.splitlines()
    found, fence = [], False
    for i, line in enumerate(lines):
        if line.startswith("```"):
            fence = not fence
        starts = line.startswith("|") and (i == 0 or not lines[i - 1].startswith("|"))
        if starts and not fence and i + 1 not in inside \
                and (i == 0 or lines[i - 1].strip() != NOT_MEASURED):
            found.append(i + 1)
    return found


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("docs", nargs="+", type=Path, help="markdown files")
    ap.add_argument("--check", action="store_true", help="change nothing; exit 1 if stale")
    args = ap.parse_args(argv)
    bad = 0
    for path in args.docs:
        text = path.read_text()
        if args.check:
            for cmd in stale(text):
                print(f"{path}: stale table: {cmd}")
                bad += 1
            for line in unsourced(text):
                print(f"{path}:{line}: a table with no <!-- table: COMMAND --> block and no "
                      f"{NOT_MEASURED} mark")
                bad += 1
        else:
            new = fill(text)
            print(f"{path}: {'updated' if new != text else 'current'}")
            path.write_text(new)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
