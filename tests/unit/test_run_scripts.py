"""tests/run-slurm.sh reaches no cluster the tests did not start (issue 9, defect 13): its
switches, run for real with a stand-in ``sinfo`` that records being called."""

import os
import re
import stat
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tests" / "run-slurm.sh"


def run(tmp_path, sinfo_answers: bool, preexec_fn=None, **env):
    """Run the script with a fake ``sinfo`` first on PATH; returns (process, sinfo was called)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    calls = tmp_path / "sinfo-calls"
    fake = bin_dir / "sinfo"
    fake.write_text(f"#!/bin/sh\necho called >> {calls}\nexit {0 if sinfo_answers else 1}\n")
    fake.chmod(0o755)
    full = dict(os.environ, PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
                MPICOLL_SLURM_DIR=str(tmp_path / "slurm"), **env)
    for name in ("MPICOLL_SKIP_SLURM", "MPICOLL_REQUIRE_SLURM", "MPICOLL_SLURM_CLUSTER"):
        if name not in env:
            full.pop(name, None)
    proc = subprocess.run(["bash", str(SCRIPT)], env=full, capture_output=True, text=True,
                          timeout=60, preexec_fn=preexec_fn)
    return proc, calls.exists()


def test_skip(tmp_path):
    proc, called = run(tmp_path, True, MPICOLL_SKIP_SLURM="1")
    assert proc.returncode == 0 and "SKIPPED slurm tests: MPICOLL_SKIP_SLURM=1" in proc.stdout
    assert not called


def test_skip_is_a_failure_when_required(tmp_path):
    """.ci/run stays strict: MPICOLL_REQUIRE_SLURM=1 turns every skip into a failure."""
    proc, _ = run(tmp_path, True, MPICOLL_SKIP_SLURM="1", MPICOLL_REQUIRE_SLURM="1")
    assert proc.returncode == 1 and "FAILED slurm tests: MPICOLL_SKIP_SLURM=1" in proc.stdout


def test_unknown_cluster_choice(tmp_path):
    proc, called = run(tmp_path, True, MPICOLL_SLURM_CLUSTER="site")
    assert proc.returncode == 2
    assert "MPICOLL_SLURM_CLUSTER must be 'local' or 'reachable', got 'site'" in proc.stderr
    assert not called


def test_reachable_without_an_answering_cluster_skips(tmp_path):
    proc, called = run(tmp_path, False, MPICOLL_SLURM_CLUSTER="reachable")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "MPICOLL_SLURM_CLUSTER=reachable, but no Slurm cluster answers" in proc.stdout
    assert called


def test_an_answering_cluster_is_not_used_by_default(tmp_path):
    """A cluster that answers sinfo (a login node's) is not the local one: as a user who cannot
    start the local cluster (``nobody`` when the tests run as root), the script skips, and never
    asks sinfo."""
    tmp_path.chmod(0o777)
    as_user = (lambda: os.setuid(65534)) if os.getuid() == 0 else None
    if as_user is not None and not _others_can_run(SCRIPT):
        pytest.skip(f"nobody cannot reach {SCRIPT} (a directory above it is private, as "
                    "mktemp -d makes one): clone it where other users can read")
    proc, called = run(tmp_path, True, preexec_fn=as_user)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SKIPPED slurm tests: the local Slurm cluster is not up" in proc.stdout
    assert "MPICOLL_SLURM_CLUSTER=reachable" in proc.stdout
    assert not called


def _others_can_run(script: Path) -> bool:
    """Whether a user other than the owner can read ``script`` (every directory above it
    searchable by others, the file readable by them)."""
    return (script.stat().st_mode & stat.S_IROTH != 0
            and all(d.stat().st_mode & stat.S_IXOTH for d in script.parents))


def _recipe(path: Path) -> str:
    text = path.read_text()
    start = text.index("<!-- site-mpi recipe")
    return text[start:text.index("<!-- /site-mpi recipe -->", start)]


def test_readme_and_slurm_docs_give_the_same_site_mpi_recipe():
    """One recipe for the site's MPI (issue 9, defect 14): docs/slurm.md holds it, the user
    guide repeats it verbatim; and it has the steps that make it right."""
    guide, slurm = _recipe(ROOT / "docs" / "guide.md"), _recipe(ROOT / "docs" / "slurm.md")
    assert guide == slurm
    for step in ("pip uninstall -y mpich",
                 "MPICC=$(which mpicc) .venv/bin/pip install --no-binary=mpi4py",
                 "--force-reinstall mpi4py",          # replaces a wheel run.sh installed
                 "python -m mpi4py --mpi-library",
                 "MPICOLL_PIP_EXTRAS=test,plot bash run.sh"):
        assert step in slurm, step
    assert "mpich" not in slurm.split("MPICOLL_PIP_EXTRAS=")[1].split()[0]
    # no second, different recipe elsewhere in these files: the recipe is the one code block
    # that installs anything (the README installs nothing by hand: run.sh does)
    for path in (ROOT / "docs" / "guide.md", ROOT / "docs" / "slurm.md"):
        blocks = re.findall(r"```bash\n(.*?)```", path.read_text(), re.S)
        installing = [b for b in blocks if "pip install" in b or "pip uninstall" in b]
        assert installing == [b for b in blocks if b in slurm], path
        assert len(installing) == 1, path
