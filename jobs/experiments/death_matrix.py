"""Rank deaths, repeated: every all-reduce algorithm (blocking) and every form (ring), at N = 3
and 4, ``--reps`` times each -- the fault matrix's death rows (issue 41).

    python jobs/experiments/death_matrix.py [--reps 20] [--ranks 3,4] [--json FILE]

Each launch is ``mpiexec -disable-auto-cleanup -n N mpicoll survive python
tests/faults/deaths.py call ...``: the last rank is SIGKILLed mid-loop. A launch is ``ok`` when
every survivor raised ``ProcessFailed`` naming exactly that rank within 2 s of the kill, shrank
within 1 s, every algorithm was exact on the shrunk communicator, and the old communicator's next
call raised at once; else ``FAIL`` with the reason. Prints one row per case and the totals.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from mpicoll.registry import ALLREDUCE
from mpicoll.testing import MPIEXEC

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tests" / "faults" / "deaths.py"
DETECT, SHRINK = 2.0, 1.0


def launch(ranks: int, form: str, algorithm: str) -> tuple[str, list]:
    """One launch: (verdict, the survivors' detection times)."""
    victim = ranks - 1
    with tempfile.TemporaryDirectory() as out:
        proc = subprocess.run(
            [MPIEXEC, "-disable-auto-cleanup", "-n", str(ranks), sys.executable, "-m",
             "mpicoll", "survive", sys.executable, str(SCRIPT), "call", "--out", out,
             f"--form={form}", f"--algorithm={algorithm}", f"--victims={victim}"],
            env=dict(os.environ, PYTHONPATH=str(ROOT), MPIEXEC_TIMEOUT="120"),
            capture_output=True, text=True, timeout=150)
        rows = {}
        for r in range(ranks):
            path = Path(out, f"rank{r}.json")
            if path.exists() and path.read_text():
                rows[r] = json.loads(path.read_text())
    survivors = [r for r in range(ranks) if r != victim]
    missing = [r for r in survivors if r not in rows]
    if missing:
        return f"FAIL: rank(s) {missing} wrote nothing ({proc.returncode})", []
    for r in survivors:
        row = rows[r]
        if row.get("error") != "ProcessFailed" or row.get("ranks") != [victim]:
            return f"FAIL: rank {r} got {row.get('error')} {row.get('ranks')}", []
        if row.get("detect") is None or row["detect"] > DETECT:
            return f"FAIL: rank {r} named it after {row.get('detect')} s", []
        if "shrink_error" in row or row["shrink"] > SHRINK or not all(row["checks"].values()):
            return f"FAIL: rank {r} shrink: {row.get('shrink_error') or row.get('checks')}", []
        if row["again"] != "ProcessFailed":
            return f"FAIL: rank {r}'s next call on the old communicator: {row['again']}", []
    return "ok", [rows[r]["detect"] for r in survivors]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--ranks", default="3,4")
    ap.add_argument("--json")
    args = ap.parse_args()
    cases = [("blocking", a) for a in sorted(set(ALLREDUCE) - {"naive"}) + ["auto"]]
    cases += [(f, "ring") for f in ("iallreduce", "persistent", "comm", "buckets")]
    table, fails = [], 0
    for ranks in (int(n) for n in args.ranks.split(",")):
        for form, algorithm in cases:
            verdicts, times = [], []
            for _ in range(args.reps):
                verdict, detect = launch(ranks, form, algorithm)
                verdicts.append(verdict)
                times += detect
            bad = [v for v in verdicts if v != "ok"]
            fails += len(bad)
            row = {"ranks": ranks, "form": form, "algorithm": algorithm, "reps": args.reps,
                   "fail": len(bad), "first_failure": bad[0] if bad else None,
                   "detect_median": statistics.median(times) if times else None,
                   "detect_max": max(times) if times else None}
            table.append(row)
            print(f"N={ranks} {form:10} {algorithm:18} {args.reps - len(bad):3}/{args.reps} ok"
                  f"  detect median {row['detect_median'] or 0:.3f} s, max "
                  f"{row['detect_max'] or 0:.3f} s" + (f"  {bad[0]}" if bad else ""),
                  flush=True)
    print(f"{len(table) * args.reps} launches, {fails} FAIL")
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": table, "fail": fails}, indent=1))
    sys.exit(1 if fails else 0)


if __name__ == "__main__":
    main()
