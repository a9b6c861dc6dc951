"""The examples in README.md, docs/guide.md and docs/buffers.md that are marked
``<!-- example: NAME ... -->`` run as written, under ``mpiexec -n 3``, and their own asserts
pass."""

import os
import re
import subprocess
import sys

import pytest

from test_harness import MPIEXEC, ROOT

pytestmark = pytest.mark.timeout(300)

MARKED = re.compile(r"<!-- example: (?P<name>[\w-]+)[^\n]*-->\n```python\n(?P<code>.*?)```",
                    re.S)
EXAMPLES = {f"{doc}:{m['name']}": m["code"]
            for doc in ("README.md", "docs/guide.md", "docs/buffers.md")
            for m in MARKED.finditer((ROOT / doc).read_text())}


def test_the_examples_are_found():
    assert {"README.md:readme", "docs/guide.md:guide", "docs/buffers.md:drop-in"} <= set(EXAMPLES)


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_example_runs(name, tmp_path):
    script = tmp_path / "example.py"
    script.write_text(EXAMPLES[name])
    proc = subprocess.run([MPIEXEC, "-n", "3", sys.executable, "-m", "mpi4py", str(script)],
                          cwd=ROOT, capture_output=True, text=True, timeout=240,
                          env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]


def test_training_md_trainer_runs(tmp_path):
    """docs/training.md's `mpiexec -n N python -m mpi4py jobs/experiments/train_dp.py ...`, a
    few steps: it runs (issue 21: it ended in an AttributeError) and prints the table the doc
    quotes."""
    assert "python -m mpi4py jobs/experiments/train_dp.py --steps 300" in \
        (ROOT / "docs/training.md").read_text()
    proc = subprocess.run([MPIEXEC, "-n", "2", sys.executable, "-m", "mpi4py",
                           "jobs/experiments/train_dp.py", "--steps", "3", "--width", "32", "--outdir", str(tmp_path)],
                          cwd=ROOT, capture_output=True, text=True, timeout=280,
                          env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "| mode | wire format | step ms |" in proc.stdout
    assert (tmp_path / "train_dp.json").exists()
