"""tests/dropin's fetching of mpi4py's suites (tests/dropin/mpi4py_suites.py): what it unpacks,
and that a pip failure is an error naming pip's reason (the harness skips on it, or fails
under CI=true; tests/run.sh's drop-in leg does the same)."""

import importlib.util
import io
import os
import tarfile
from pathlib import Path

import pytest
from mpi4py import MPI

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("mpi4py_suites",
                                               ROOT / "tests" / "dropin" / "mpi4py_suites.py")
suites = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(suites)


def _sdist(path: Path, names) -> Path:
    with tarfile.open(path, "w:gz") as tar:
        for name in names:
            data = f"# {name}\n".encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def test_unpack_takes_only_the_test_directory(tmp_path):
    names = [f"mpi4py-9/test/{s}.py" for s in suites.SUITES] + \
        ["mpi4py-9/test/arrayimpl.py", "mpi4py-9/src/mpi4py/MPI.pyx", "mpi4py-9/test/data/x.py"]
    out = tmp_path / "out"
    out.mkdir()
    suites.unpack(_sdist(tmp_path / "s.tar.gz", names), out)
    assert sorted(p.name for p in out.iterdir()) == sorted(
        [f"{s}.py" for s in suites.SUITES] + ["arrayimpl.py"])
    with pytest.raises(RuntimeError, match="test/ has no test_cco_pr_buf"):
        suites.unpack(_sdist(tmp_path / "t.tar.gz", names[:2]), out / "..")


def test_a_pip_failure_names_pips_reason(tmp_path, monkeypatch):
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", os.fspath(tmp_path))     # holds no mpi4py
    with pytest.raises(RuntimeError, match="No matching distribution found for mpi4py=="):
        suites.download(tmp_path)
    monkeypatch.setattr(suites, "download", lambda d: (_ for _ in ()).throw(
        RuntimeError("pip exited 1")))
    where, why = suites.fetch(None, MPI.COMM_SELF)
    assert where is None and why.startswith(f"mpi4py {suites.version()}'s test suites are not "
                                            "available: pip exited 1")
