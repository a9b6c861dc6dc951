"""Every measured table in docs/results.md, performance.md and training.md is the output of the
command its block names, from JSON kept in docs/results/ (docs/generators/doc_tables.py), as
tests/unit/test_labs.py does for labs.md: a table edited by hand, or data changed without the
table, fails here. A table that is not a measurement is marked ``<!-- not measured -->``."""

import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "docs" / "generators"))   # what writes the docs' tables

import doc_tables  # noqa: E402

DOCS = ["docs/results.md", "docs/performance.md", "docs/training.md"]

pytestmark = pytest.mark.timeout(300)


@pytest.mark.parametrize("doc", DOCS)
def test_every_table_names_its_command(doc):
    text = (ROOT / doc).read_text()
    assert doc_tables.unsourced(text) == [], \
        f"{doc}: tables at these lines have no <!-- table: COMMAND --> block"
    assert any(m["kind"] == "table" for m in doc_tables.BLOCK.finditer(text))


@pytest.mark.parametrize("doc", DOCS)
def test_tables_are_what_their_commands_print_today(doc):
    text = (ROOT / doc).read_text()
    stale = doc_tables.stale(text)
    assert stale == [], \
        f"{doc}: stale tables, run python docs/generators/doc_tables.py {doc}: {stale}"


def test_fabric_tables_outside_the_report_are_what_their_commands_print_today():
    """docs/fabric.md's own blocks (docs/generators/fabric_report.py writes the rest, between its markers):
    auto without a table, jobs/experiments/fabric_bench.py --table."""
    text = (ROOT / "docs/fabric.md").read_text()
    blocks = [m["arg"] for m in doc_tables.BLOCK.finditer(text)]
    assert any("fabric_bench.py --table" in arg for arg in blocks)
    assert doc_tables.stale(text) == []


def test_the_checks_can_fail():
    text = (ROOT / "docs/training.md").read_text()
    row = re.search(r"\| blocking \| fp32 \| [0-9.]+ \|", text)[0]   # N = 4's table comes first
    edited = text.replace(row, "| blocking | fp32 | 123456.78 |", 1)
    assert edited != text
    assert doc_tables.stale(edited) == ["python jobs/experiments/train_dp.py --table "
                                        "docs/results/train_dp-np4.json"]
    bare = "intro\n\n| a | b |\n|---|---|\n| 1 | 2 |\n\n<!-- not measured -->\n| c |\n|---|\n"
    assert doc_tables.unsourced(bare) == [3]
