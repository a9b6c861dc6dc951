"""Get mpi4py's own test suites, from the source release of the installed mpi4py.

mpi4py's code is not in this repository: ``pip download`` fetches the sdist (pip checks it
against PyPI's hash, and keeps it in its cache), and only its ``test/`` directory is unpacked.
Only mpi4py itself is asked for as source (``--no-binary mpi4py``): pip prepares the sdist's
metadata in an isolated build environment, and with ``--no-binary :all:`` that environment's
setuptools and Cython were built from source too -- 6.5 minutes of compiling on a fresh machine
(CI's 300 s limit), against 17 s with their wheels.

    python tests/dropin/mpi4py_suites.py DIR     # download into DIR, print the sdist's path

(tests/run.sh does this once, then passes ``--mpi4py-sdist`` to each run of the harness.)
"""

from __future__ import annotations

import atexit
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from collections import Counter
from pathlib import Path

SUITES = ("test_cco_buf", "test_cco_nb_buf", "test_cco_pr_buf")   # mpicoll runs their collectives
# The rest of what a communicator does, which mpicoll.Comm hands to MPI: run through the wrapper
# too, where the installed mpi4py's release has them (the drop-in must not change them).
PASS_THROUGH = ("test_cco_obj", "test_cco_vec", "test_cco_nb_vec", "test_cco_pr_vec",
                "test_cco_ngh_buf", "test_cco_ngh_obj", "test_cco_pr_ngh_buf", "test_comm",
                "test_comm_topo", "test_p2p_buf", "test_p2p_obj", "test_rma",
                "test_cco_buf_inter", "test_cco_obj_inter", "test_cco_vec_inter",
                "test_comm_inter")
OPTIONS: dict = {}      # the harness's pytest options (conftest.py): sdist, algorithm
COUNTS: Counter = Counter()         # collective -> calls mpicoll ran (the harness counts them)
FALLBACKS: Counter = Counter()      # mpi4py method -> calls mpicoll.Comm handed to MPI


def version() -> str:
    import mpi4py
    return mpi4py.__version__


def download(directory: str | os.PathLike) -> Path:
    """``pip download`` the installed mpi4py's sdist into ``directory``; its path.

    Raises RuntimeError (with pip's last lines) if pip can't get it."""
    directory = Path(directory)
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", "mpi4py",
               "--disable-pip-version-check", "-q", f"mpi4py=={version()}", "-d", str(directory)]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise RuntimeError(f"{' '.join(command)}: {exc}") from None
    found = sorted(directory.glob(f"mpi4py-{version()}.tar.gz"))
    if done.returncode or not found:
        tail = "\n".join((done.stderr or done.stdout).strip().splitlines()[-5:])
        raise RuntimeError(f"{' '.join(command)} exited {done.returncode}: {tail}")
    return found[0]


def unpack(sdist: str | os.PathLike, directory: str | os.PathLike) -> Path:
    """Unpack the sdist's ``test/`` directory into ``directory``; its path."""
    directory = Path(directory)
    with tarfile.open(sdist) as tar:
        members = [m for m in tar.getmembers()
                   if m.isfile() and len(Path(m.name).parts) == 3
                   and Path(m.name).parts[1] == "test" and m.name.endswith(".py")]
        if not members:
            raise RuntimeError(f"{sdist} has no test/ directory")
        for member in members:
            target = directory / Path(member.name).name
            target.write_bytes(tar.extractfile(member).read())
    missing = [s for s in SUITES if not (directory / f"{s}.py").exists()]
    if missing:
        raise RuntimeError(f"{sdist}: test/ has no {', '.join(missing)}")
    return directory


def fetch(sdist: str | None, comm) -> tuple[Path | None, str]:
    """(the unpacked test directory, "") on every rank, or (None, why not) on every rank.

    Rank 0 downloads (unless given ``sdist``) and unpacks into a temporary directory the
    other ranks read (the harness runs on one node)."""
    where, why = None, ""
    if comm.Get_rank() == 0:
        try:
            scratch = Path(tempfile.mkdtemp(prefix="mpicoll-mpi4py-tests-"))
            atexit.register(shutil.rmtree, scratch, True)
            if sdist is None:
                sdist = download(scratch / "sdist")
            where = str(unpack(sdist, scratch))
        except (RuntimeError, OSError, tarfile.TarError) as exc:
            why = f"mpi4py {version()}'s test suites are not available: {exc}"
    where, why = comm.bcast((where, why), root=0)
    return (Path(where) if where else None), why


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    try:
        print(download(sys.argv[1]))
    except RuntimeError as exc:
        sys.exit(f"mpi4py_suites.py: {exc}")
