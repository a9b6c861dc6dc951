"""``reproducible.warmup`` (which ``python -m mpicoll.tools.warm`` runs at set-up) covers every
kernel a reproducible call with the default K runs: in a fresh ``mpiexec`` job that calls it
first, every form of every path -- blocking (small: the slices' all-reduce; large: the values'
exchange, two rows or more), nonblocking, persistent, ``reduce_scatter_block``, the ``shm`` and
``mpi`` algorithms' nested calls, local sums all-reduced -- of every dtype adds no signature to
any of the kernels' compiled functions (``slice_kernels``, ``round_kernels``), so no rank's
first call compiles."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from mpicoll.testing import MPIEXEC

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = '''
import json, sys
import numpy as np
from mpi4py import MPI
from numba.core.registry import CPUDispatcher
import mpicoll
from mpicoll import reproducible as R
from mpicoll.reproducible import round_kernels, slice_kernels

comm = MPI.COMM_WORLD
R.warmup()
compiled = {f"{m.__name__}.{name}": f for m in (slice_kernels, round_kernels)
            for name, f in vars(m).items() if isinstance(f, CPUDispatcher)}
assert len(compiled) > 20, sorted(compiled)     # the kernels' modules hold them
before = {name: len(f.signatures) for name, f in compiled.items()}
calls = 0
for dtype in R.DTYPES:
    for n in (7, R.SPLIT_BYTES // 16 + 5):       # the slices' all-reduce; the exchange
        x = (np.arange(n) % 7 - 3).astype(dtype)
        mpicoll.allreduce(x, reproducible=True)
        mpicoll.iallreduce(x, reproducible=True).wait()
        h = mpicoll.allreduce_init(x, np.empty_like(x), reproducible=True)
        h()
        h.free()
        mpicoll.reduce_scatter_block(np.tile(x, comm.size), reproducible=True)
        for algorithm in ("shm", "mpi", "ring"):
            mpicoll.allreduce(x, reproducible=True, algorithm=algorithm)
        mpicoll.allreduce(R.sum(np.stack([x, x])), reproducible=True)
        calls += 8
grown = {name: len(f.signatures) - before[name] for name, f in compiled.items()
         if len(f.signatures) > before[name]}
with open(f"{sys.argv[1]}/rank{comm.rank}.json", "w") as out:
    json.dump({"rank": comm.rank, "calls": calls, "grown": grown}, out)
'''


@pytest.mark.parametrize("ranks", [2, 3])
def test_warmup_covers_every_default_call(tmp_path, ranks):
    assert MPIEXEC, "mpiexec not found next to python or on PATH (pip install .[mpich])"
    script = tmp_path / "warm_check.py"
    script.write_text(SCRIPT)
    env = dict(os.environ, PYTHONPATH=str(ROOT), MPIEXEC_TIMEOUT="300")
    proc = subprocess.run([MPIEXEC, "-n", str(ranks), sys.executable, str(script),
                           str(tmp_path)], env=env, cwd=ROOT, capture_output=True, text=True,
                          timeout=330)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    rows = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(ranks)]
    for row in rows:
        assert row["calls"] == 8 * 4 * 2, row
        assert row["grown"] == {}, f"compiled on rank {row['rank']} after warmup(): {row}"
