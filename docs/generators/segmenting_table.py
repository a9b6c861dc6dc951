"""The markdown table of docs/performance.md's segmenting section, from `mpicoll bench` JSON.

    for n in 2 4; do for r in 1 2; do for s in model 0; do
      MPICOLL_SEGMENT_BYTES=$([ $s = 0 ] && echo 0) mpiexec -n $n python -m mpicoll bench \\
        -b 4M -e 64M -f 2 -a ring,recursive_halving --json seg/b_n${n}_${s}_$r.json
    done; done; done
    python docs/generators/segmenting_table.py seg

(``MPICOLL_SEGMENT_BYTES=`` empty is unset: the cost model's rule.) Each cell is vs_mpi, MPI's
median time over the algorithm's in the same run (> 1: faster than MPI), run 1 / run 2, for
the segmented (``model``) and unsegmented (``0``) runs, which alternate.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def main(argv=None) -> int:
    folder = Path((argv or sys.argv[1:] or ["."])[0])
    ratio = {}                          # (n, setting, run, algorithm, size) -> vs_mpi
    for path in sorted(folder.glob("b_n*_*_*.json")):
        _, n, setting, run = path.stem.split("_")
        for rec in json.loads(path.read_text())["records"]:
            ratio[int(n[1:]), setting, run, rec["algorithm"], rec["size"]] = rec["vs_mpi"]
    algorithms = ("ring", "recursive_halving")
    for n in sorted({key[0] for key in ratio}):
        runs = sorted({key[2] for key in ratio if key[0] == n})
        print(f"\nN = {n} (vs_mpi, run {' / run '.join(runs)})\n")
        print("| size | " + " | ".join(f"{a} segmented | {a} unsegmented" for a in algorithms)
              + " |")
        print("|---:|" + "---:|" * (2 * len(algorithms)))
        for size in sorted({key[4] for key in ratio if key[0] == n}):
            cells = []
            for a in algorithms:
                for setting in ("model", "0"):
                    cells.append(" / ".join(f"{ratio.get((n, setting, r, a, size), 0):.2f}"
                                            for r in runs))
            print(f"| {size >> 20} MiB | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
