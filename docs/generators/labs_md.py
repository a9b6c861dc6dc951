"""docs/labs.md's lab blocks and summary table, from the labs' recorded output (no MPI, no timing).

    python docs/generators/labs_md.py docs/labs.md docs/labs   # docs/make-labs.sh's last step

tests/unit/test_labs.py checks that docs/labs.md is what ``fill`` makes of docs/labs/.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

__all__ = ["BLOCK", "SUMMARY", "recorded", "fill", "update"]

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


if __name__ == "__main__":          # python docs/generators/labs_md.py docs/labs.md docs/labs
    changed = update(Path(sys.argv[1]), Path(sys.argv[2]))
    print(f"{sys.argv[1]}: {'updated' if changed else 'already current'}")
