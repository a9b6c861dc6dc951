"""mpi4py's own collective suites, unchanged, with their communicators wrapped in mpicoll.Comm.

``test_cco_buf``, ``test_cco_nb_buf`` and ``test_cco_pr_buf`` come from the source release of
the installed mpi4py (``mpi4py_suites.py``: pip, never this repository). Each of their test
classes is subclassed here with one change: ``setUp`` wraps ``self.COMM`` (COMM_SELF,
COMM_WORLD, or the ``Dup()`` the suite made) in ``mpicoll.Comm``. The test bodies run as
mpi4py wrote them. What mpicoll.Comm does not wrap (``Gather``, ``Scan``, ``Barrier_init``
...) is the communicator's own, so those tests run MPI's collectives, as before. The suites of
``mpi4py_suites.PASS_THROUGH`` (pickled and vector collectives, neighbourhoods, point-to-point,
RMA, topologies, intercommunicators, the communicator's own methods) run the same way where the
release has them: everything in them is handed to MPI, and must behave as on a plain
communicator.

The wrapper is made with ``fallback=True``: what mpicoll can't run -- a reduction of
``MPI.LONG_DOUBLE`` / ``C_LONG_DOUBLE_COMPLEX`` (no numba kernel), a buffer with
``__cuda_array_interface__`` (arrayimpl's fake GPU arrays: device memory to mpicoll) -- goes to
the MPI library's own collective, counted (``Comm.fallbacks``) and printed at the end.

Every call of mpicoll's collectives is counted (``mpicoll.api.allreduce``, ``iallreduce``,
``persistent.allreduce_init`` ...), and a test of a wrapped collective (``testAllreduce``,
``testBcast`` ...) fails unless that collective's count grew: so a pass means mpicoll ran it.
Each test's verdict is agreed over COMM_WORLD (a failure on one rank fails it on all).

    mpiexec -n 2 python -m mpi4py -m pytest tests/dropin --with-mpi -q --timeout=120
    ... --dropin-algorithm ring        # the wrapper's algorithm (default auto)
    ... --dropin-algorithm plain       # no wrapper: mpi4py alone (the control)
    ... --mpi4py-sdist mpi4py-4.1.2.tar.gz     # instead of pip download
"""

import functools
import importlib
import os
import sys
import unittest

import pytest
from mpi4py import MPI

import mpi4py_suites
import mpicoll
from mpicoll import api, persistent

WORLD = MPI.COMM_WORLD
ALGORITHM = mpi4py_suites.OPTIONS.get("algorithm", "auto")

# ----------------------------------------------------------------------------- the suites

_where, _why = mpi4py_suites.fetch(mpi4py_suites.OPTIONS.get("sdist"), WORLD)
if _where is None:
    if os.environ.get("CI") == "true":
        raise RuntimeError(f"{_why} (CI=true: the drop-in suites must run)")
    pytest.skip(_why, allow_module_level=True)
sys.path.insert(0, str(_where))

# mpi4py's runner (test/main.py) leaves out the GPU array backends unless --cupy / --numba are
# given, by hiding those modules; mpicoll needs numba, so it is hidden only while arrayimpl
# decides its backends: numpy, array, and DLPack over each (as mpi4py's default run).
_numba = sys.modules.get("numba")
sys.modules["numba"] = sys.modules["cupy"] = None
try:
    import arrayimpl  # noqa: F401
finally:
    sys.modules["numba"] = _numba
    del sys.modules["cupy"]

# ----------------------------------------------------------------------------- counting

COUNTS = mpi4py_suites.COUNTS       # collective -> mpicoll calls
FALLBACKS = mpi4py_suites.FALLBACKS     # method -> calls handed to MPI (fallback=True)
COLLECTIVES = ("allreduce", "reduce_scatter_block", "allgather", "bcast")
CHECKED = {"testAllreduce": "allreduce", "testReduceScatterBlock": "reduce_scatter_block",
           "testAllgather": "allgather", "testBcast": "bcast", "testBcastTypeIndexed": "bcast"}


def _counting(module, name: str, collective: str) -> None:
    original = getattr(module, name)

    @functools.wraps(original)
    def counted(*args, **kwargs):
        COUNTS[collective] += 1
        return original(*args, **kwargs)

    setattr(module, name, counted)


for _c in COLLECTIVES:
    _counting(api, _c, _c)
    _counting(api, f"i{_c}", _c)
    _counting(persistent, f"{_c}_init", _c)

# ----------------------------------------------------------------------------- the wrapping


def _agreed(method, collective):
    """``method``, its verdict agreed over COMM_WORLD; with ``collective``: mpicoll ran it."""

    @functools.wraps(method)
    def test(self):
        before = COUNTS[collective]
        failure = None
        try:
            method(self)
            if isinstance(self.COMM, mpicoll.Comm):
                FALLBACKS.update(self.COMM.fallbacks)
        except unittest.SkipTest:
            raise                       # decided the same way on every rank
        except Exception as exc:        # noqa: BLE001 - reported to every rank
            failure = exc
        note = ""
        if failure is None and collective and ALGORITHM != "plain" \
                and COUNTS[collective] == before:
            note = f"mpicoll's {collective} was not called: the wrapper did not run it"
        elif failure is not None:
            note = f"{type(failure).__name__}: {failure}"
        notes = WORLD.allgather(note)
        if failure is not None:
            raise failure
        bad = [f"[rank {r}] {n}" for r, n in enumerate(notes) if n]
        if bad:
            raise AssertionError("; ".join(bad))

    return test


def _wrapped(suite: str, base: type) -> type:
    counted = suite in mpi4py_suites.SUITES         # a pass-through suite's calls are MPI's
    def setUp(self):
        base.setUp(self)
        if ALGORITHM != "plain":
            self.COMM = mpicoll.Comm(self.COMM, algorithm=ALGORITHM, fallback=True)

    namespace = {"setUp": setUp, "__module__": __name__, "__qualname__": None}
    for name in dir(base):
        if name.startswith("test") and callable(getattr(base, name)):
            namespace[name] = _agreed(getattr(base, name),
                                      CHECKED.get(name) if counted else None)
    name = f"Test_{suite}_{base.__name__}"
    namespace["__qualname__"] = name
    return type(name, (base,), namespace)


for _suite in mpi4py_suites.SUITES + tuple(s for s in mpi4py_suites.PASS_THROUGH
                                          if (_where / f"{s}.py").exists()):
    _module = importlib.import_module(_suite)
    for _name, _base in sorted(vars(_module).items()):
        if isinstance(_base, type) and issubclass(_base, unittest.TestCase) \
                and _name.startswith("Test") and hasattr(_base, "COMM"):
            _cls = _wrapped(_suite, _base)
            globals()[_cls.__name__] = _cls
del _c, _suite, _module, _name, _base, _cls
