"""The reliability options, on one process: parsing, defaults, the error messages."""

import inspect
import math

import numpy as np
import pytest
from mpi4py import MPI

import mpicoll
from mpicoll._runtime import validate
from mpicoll._runtime.call import Call
from mpicoll.errors import CollectiveTimeout
from mpicoll.testing import environment

COMM = MPI.COMM_SELF
COLLECTIVES = {
    "allreduce": lambda **o: mpicoll.allreduce(np.ones(3), comm=COMM, **o),
    "reduce_scatter_block": lambda **o: mpicoll.reduce_scatter_block(np.ones(3), comm=COMM, **o),
    "allgather": lambda **o: mpicoll.allgather(np.ones(3), comm=COMM, **o),
    "bcast": lambda **o: mpicoll.bcast(np.ones(3), comm=COMM, **o),
}


@pytest.mark.parametrize("collective", list(COLLECTIVES))
@pytest.mark.parametrize("options", [{"timeout": 5}, {"timeout": math.inf},
                                     {"timeout": 0.5, "on_timeout": "abort"},
                                     {"validate": True}, {"validate": False}])
def test_options_accepted_everywhere(collective, options):
    out = COLLECTIVES[collective](algorithm="mpi", **options)
    assert np.asarray(out).sum() == 3


@pytest.mark.parametrize("collective", list(COLLECTIVES))
def test_options_are_keyword_only(collective):
    params = inspect.signature(getattr(mpicoll, collective)).parameters
    for name in ("timeout", "on_timeout", "validate"):
        assert params[name].kind is inspect.Parameter.KEYWORD_ONLY
        assert params[name].default is None


@pytest.mark.parametrize("options, exc, match", [
    ({"timeout": 0}, ValueError, r"timeout must be a positive number of seconds .*got 0"),
    ({"timeout": -1.5}, ValueError, "got -1.5"),
    ({"timeout": float("nan")}, ValueError, "got nan"),
    ({"timeout": "5"}, ValueError, "got '5'"),
    ({"timeout": True}, ValueError, "got True"),
    ({"on_timeout": "retry"}, ValueError, "on_timeout must be 'exception' or 'abort', got 'retry'"),
    ({"validate": "yes"}, TypeError, "validate must be True or False, got 'yes'"),
])
def test_bad_options(options, exc, match):
    with pytest.raises(exc, match=match):
        mpicoll.allreduce(np.ones(3), comm=COMM, **options)


@pytest.mark.parametrize("variable, value, match", [
    ("MPICOLL_TIMEOUT", "soon", "MPICOLL_TIMEOUT must be a positive number of seconds"),
    ("MPICOLL_TIMEOUT", "-3", "got -3.0"),
    ("MPICOLL_ON_TIMEOUT", "Abort", "MPICOLL_ON_TIMEOUT must be 'exception' or 'abort'"),
    ("MPICOLL_VALIDATE", "true", "MPICOLL_VALIDATE must be 0 or 1, got 'true'"),
])
def test_bad_environment(variable, value, match):
    with pytest.raises(ValueError, match=match):
        with environment(**{variable: value}):
            mpicoll.allreduce(np.ones(3), comm=COMM)
    mpicoll.allreduce(np.ones(3), comm=COMM)          # restored


def test_environment_defaults():
    with environment(MPICOLL_TIMEOUT="2.5", MPICOLL_ON_TIMEOUT="abort", MPICOLL_VALIDATE="1"):
        call = Call("allreduce", "auto", MPI.COMM_WORLD, None, None, None)
        assert (call.timeout, call.on_timeout) == (2.5, "abort")
        assert call.validate == (MPI.COMM_WORLD.Get_size() > 1)
        explicit = Call("allreduce", "auto", COMM, math.inf, "exception", False)
        assert (explicit.timeout, explicit.on_timeout, explicit.validate) == \
            (None, "exception", False)
    with environment(MPICOLL_TIMEOUT="inf"):
        assert Call("allreduce", "auto", COMM, None, None, None).timeout is None
    with environment(MPICOLL_TIMEOUT=None, MPICOLL_ON_TIMEOUT=None, MPICOLL_VALIDATE=None):
        call = Call("allreduce", "auto", COMM, None, None, None)
        assert (call.timeout, call.on_timeout, call.validate) == (None, "exception", False)


def test_timeout_message_names_everything():
    exc = CollectiveTimeout("allreduce ring", 1, 4, waiting_on={0}, missing={2}, gave_up={0},
                            timeout=5.0)
    assert exc.peers == [2] and exc.waiting_on == [0] and isinstance(exc, TimeoutError)
    assert str(exc) == ("allreduce ring: timed out after 5 s in step 1 of 4, waiting for rank(s) "
                        "[0]; rank(s) [2] did not answer the roll call (never entered this call, "
                        "exited or died)")
    joined = CollectiveTimeout("bcast mpi", "MPI_Ibcast", 0, gave_up={1, 3}, missing={2})
    assert str(joined).startswith("bcast mpi: gave up in MPI_Ibcast because rank(s) [1, 3] "
                                  "timed out; rank(s) [2]")
    slow = CollectiveTimeout("allgather ring", 0, 2, waiting_on={1}, timeout=1)
    assert slow.peers == [1] and "every rank answered" in str(slow)


def test_mismatch_report():
    """Every rank builds the same report from the table of fingerprints."""
    rows = [validate.fingerprint("allreduce", "ring", "sum", np.dtype(np.float64), 10)
            for _ in range(4)]
    rows[2][validate.FIELDS.index("count")] = 11
    rows[3] = validate.rejected("allreduce", TypeError("no"))
    exc = validate.mismatch("allreduce", np.array(rows))
    assert isinstance(exc, ValueError) and exc.ranks == [2, 3]
    assert str(exc) == ("allreduce: the ranks called it with different arguments "
                        "(validate=True): rank(s) [3] rejected their own arguments (TypeError); "
                        "count: 10 on rank(s) [0, 1], 11 on rank(s) [2]")
    assert exc.fields == {"count": {"10": [0, 1], "11": [2]}}
