"""docs/generators/fabric_report.py's run-to-run table (docs/fabric.md, *How close two runs are*): how far
a repeated sweep's medians are from the sweep's, and the host model's +-25 % on each."""

import json
import re
import shutil
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "docs" / "generators"))   # what writes the docs' tables

import fabric_report  # noqa: E402

pytestmark = pytest.mark.timeout(300)
SWEEP = ROOT / "docs/results/fabric-bench-veth-1g-2x2.json"


def _report(tmp_path, scale: dict) -> dict:
    """The run-to-run row of 2 x 2 at 1 Gbit/s when the repeat is the sweep with each
    variant's times multiplied by ``scale`` (1 if absent)."""
    results = tmp_path / "results"
    results.mkdir()
    shutil.copy(SWEEP, results / SWEEP.name)
    for p in (ROOT / "docs/results").glob(f"{fabric_report.STACK}*.json"):
        shutil.copy(p, results / p.name)
    data = json.loads(SWEEP.read_text())
    for r in data["records"]:
        r["time_us"] *= scale.get(r["algorithm"], 1.0)
    (results / SWEEP.name.replace(".json", "-repeat.json")).write_text(json.dumps(data))
    text = fabric_report.report(fabric_report.load_runs(results), results, tmp_path)
    [row] = [line for line in text.splitlines() if line.startswith("| veth-1g | 2x2 |")
             and line.count("|") == 11]
    cells = [c.strip() for c in row.strip("|").split("|")]
    return dict(zip(("fabric", "layout", "points", "apart", "ratio", "simulated", "sweep",
                     "repeat", "both", "either"), cells))


def test_a_repeat_equal_to_the_sweep_is_nowhere_apart(tmp_path):
    row = _report(tmp_path, {})
    assert row["apart"] == "0" and row["ratio"] == "1.00 (1.00-1.00)"
    assert row["sweep"] == row["repeat"] == row["both"] == row["either"]
    # the same count the simulator's own table gives this layout's host model
    sim = json.loads((tmp_path / "results/fabric-sim-veth-1g-2x2.json").read_text())
    assert int(row["sweep"]) == sim["stats"]["host"]["within"]
    assert int(row["simulated"]) == sim["stats"]["host"]["total"]


def test_a_variant_twice_as_slow_in_the_repeat_is_counted_apart(tmp_path):
    sweep = fabric_report.table(json.loads(SWEEP.read_text())["records"])
    ring_points = sum(1 for s, row in sweep.items() if s >= fabric_report.SIM_MIN and "ring" in row)
    row = _report(tmp_path, {"ring": 2.0})
    assert int(row["apart"]) == ring_points > 0
    assert re.fullmatch(r"1\.00 \(1\.00-2\.00\)", row["ratio"])
    # a ring predicted within +-25 % of the sweep can't be within it of twice the time
    assert int(row["repeat"]) < int(row["sweep"]) and int(row["both"]) < int(row["either"])
