"""The documented commands that are cheap to run, run for real in their small forms
(tests/unit/test_doc_commands.py's ``CHEAP``: the same program and subcommand or script, small
sizes, at most 4 ranks): each exits 0 within its timeout. Each runs under bash in a temporary
folder that links the checkout's jobs/, docs/, mpicoll/ and tests/, so what it writes stays
there."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "unit"))

from test_doc_commands import CHEAP  # noqa: E402

pytestmark = pytest.mark.timeout(200)

SUBCOMMANDS = ("bench", "calibrate", "model", "tune", "plot", "report", "trace", "simulate")


def run(command: str, cwd: Path, timeout: float = 180) -> subprocess.CompletedProcess:
    for name in ("jobs", "docs", "mpicoll", "tests"):
        if not (cwd / name).exists():
            (cwd / name).symlink_to(ROOT / name)
    bin_dir = str(Path(sys.executable).parent)     # python, mpicoll and mpiexec of this venv
    env = dict(os.environ, PATH=f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
               PYTHONPATH=str(ROOT), MPLBACKEND="Agg", MPICOLL_TIMEOUT="120")
    return subprocess.run(["bash", "-c", f"set -o pipefail; {command}"], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=timeout)


# small form -> the documented commands it stands for: a form that stands for two documented
# commands (e.g. Open MPI's spelling of a bench and MPICH's) runs once
FORMS: dict = {}
for _documented in sorted(CHEAP):
    FORMS.setdefault(CHEAP[_documented], []).append(_documented)


@pytest.mark.parametrize("documented", [names[0] for names in FORMS.values()])
def test_documented_command_runs(documented, tmp_path):
    names = FORMS[CHEAP[documented]]
    proc = run(CHEAP[documented], tmp_path)
    assert proc.returncode == 0, (f"{names!r} as {CHEAP[documented]!r} exited "
                                  f"{proc.returncode}:\n{proc.stdout[-1500:]}\n"
                                  f"{proc.stderr[-2500:]}")
    assert "Traceback" not in proc.stderr, proc.stderr[-2500:]


def test_every_subcommand_has_help(tmp_path):
    """The user guide's `mpicoll COMMAND -h`, for each COMMAND."""
    for sub in SUBCOMMANDS:
        proc = run(f"mpicoll {sub} -h", tmp_path, timeout=60)
        assert proc.returncode == 0 and "usage:" in proc.stdout, (sub, proc.stderr[-1500:])


def test_a_failing_command_fails(tmp_path):
    proc = run("mpicoll trace no_such_algorithm -N 4", tmp_path, timeout=60)
    assert proc.returncode != 0
