"""What a first call imports (issue 21, "a fast first call"): ``ml_dtypes`` (about 1 s of CPU per
process, for bfloat16) only once a bfloat16 dtype is used, and shm's kernels, window and
transport only once shm runs. Each check runs in a fresh interpreter."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.timeout(120)


def loaded(code: str) -> set:
    """The modules (of a few of interest) loaded after running ``code`` in a new interpreter."""
    probe = ("import sys\n" + code + "\nprint(' '.join(m for m in sys.modules if m == "
             "'ml_dtypes' or m.startswith('mpicoll.shm.') or m == 'numba'))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         timeout=100, env=dict(os.environ, PYTHONPATH=str(ROOT)), cwd=ROOT)
    assert out.returncode == 0, out.stderr[-2000:]
    return set(out.stdout.split())


def test_import_mpicoll_is_light():
    assert loaded("import mpicoll") == set()


def test_the_api_and_registry_leave_ml_dtypes_and_shm_kernels_alone():
    got = loaded("import mpicoll.api, mpicoll.registry, mpicoll.kernels, mpicoll.ops, "
                 "mpicoll.select, mpicoll.algorithms.allreduce_shm\n"
                 "from mpicoll import kernels\n"
                 "import numpy as np\n"
                 "assert np.dtype('float32') in kernels.DTYPES\n"
                 "assert kernels.DTYPES.index(np.dtype('int64')) == 3\n"
                 "assert kernels.storage(np.float16) == np.uint16")
    assert "ml_dtypes" not in got and not {m for m in got if m.startswith("mpicoll.shm.k")}, got


def test_a_bfloat16_dtype_brings_it_in():
    got = loaded("from mpicoll import kernels\n"
                 "import numpy as np\n"
                 "bf16 = kernels.bfloat16\n"
                 "assert bf16 in kernels.DTYPES and kernels.storage(bf16) == np.uint16\n"
                 "assert kernels.ops_for(bf16) == ('sum', 'prod', 'max', 'min')\n"
                 "assert kernels.kernel_name('sum', bf16) == 'bfloat16_sum'\n"
                 "assert str(kernels.DTYPES[11]) == 'bfloat16' and len(kernels.DTYPES) == 15")
    assert "ml_dtypes" in got


def test_the_shm_names_still_resolve():
    got = loaded("from mpicoll import shm\n"
                 "from mpicoll.algorithms import allreduce_shm\n"
                 "assert allreduce_shm.CHUNK_BYTES == shm.CHUNK_BYTES > 0\n"
                 "assert callable(shm.window_allreduce) and callable(shm.warmup)\n"
                 "assert shm.kernels.slice_of is allreduce_shm._slice")
    assert "mpicoll.shm.kernels" in got and "mpicoll.shm.transport" in got
