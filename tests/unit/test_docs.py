"""The docs quote the code: traces are current, every algorithm is documented with its cost."""

import re
import shlex
from pathlib import Path

import pytest

from mpicoll.tools import trace
from mpicoll.registry import COLLECTIVES

ROOT = Path(__file__).resolve().parents[2]
ALGORITHMS_MD = (ROOT / "docs/algorithms.md").read_text()
BLOCKS = list(trace.BLOCK.finditer(ALGORITHMS_MD))


@pytest.mark.parametrize("block", BLOCKS, ids=[b["args"] for b in BLOCKS])
def test_trace_blocks_are_current(block):
    want = "```\n" + trace.render(trace.parser().parse_args(shlex.split(block["args"]))) + "```\n"
    assert block["body"] == want, ("stale trace; run: python -m mpicoll trace --update "
                                   "docs/algorithms.md")


@pytest.mark.parametrize("collective, name", [(c, a) for c, t in COLLECTIVES.items()
                                              for a in t if a != "mpi"])
def test_every_algorithm_is_traced_and_costed(collective, name):
    algo = COLLECTIVES[collective][name]
    if algo.scheduled:                  # a shared-memory algorithm has no schedule to trace
        parsed = [trace.parser().parse_args(shlex.split(b["args"])) for b in BLOCKS]
        assert (collective, name) in {(a.collective, a.algorithm) for a in parsed}
    else:
        assert re.search(rf"^## {name} ", ALGORITHMS_MD, re.M), f"no section on {name}"
    module = algo.module
    assert re.search(r"Cost", module.__doc__), f"{module.__name__} docstring has no cost formula"
    assert module.cost(4, 1e6, 1e-6, 1e-9, 1e-10) > 0
