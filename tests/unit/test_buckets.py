"""``Buckets`` that can't be misused: every argument checked at construction, read-only grads,
the arrays given are the gradients (or views with ``gradient_as_bucket_view=True``), one bucket
per dtype, state reset after a failed step."""

import numpy as np
import pytest
from mpi4py import MPI

import mpicoll

COMM = MPI.COMM_SELF


@pytest.mark.parametrize("kwargs, exc, match", [
    ({"arrays": [np.zeros(3, np.int32)]}, TypeError, "average=True .* floating-point .* int32"),
    ({"arrays": [[0.0, 1.0], [2.0]]}, TypeError, r"arrays\[0\] must be an array"),
    ({"arrays": 5}, TypeError, "a sequence of arrays, got int"),
    ({"arrays": []}, ValueError, "at least one array"),
    ({"arrays": [np.zeros(3)], "op": "max"}, ValueError, "average=True needs op='sum'"),
    ({"arrays": [np.zeros(3, bool)], "average": False}, TypeError, "bool"),
    ({"arrays": [np.zeros(3)], "algorithm": "butterfly"}, ValueError, "unknown allreduce"),
    ({"arrays": [np.zeros(3)], "bucket_bytes": 0}, ValueError, "bucket_bytes"),
    ({"arrays": [np.zeros(3)], "first_bucket_bytes": 1.5}, ValueError, "first_bucket_bytes"),
    ({"arrays": [np.zeros(3)], "compress": "bf16"}, ValueError, "float32"),
    ({"arrays": [np.zeros(3)], "error_feedback": True}, ValueError, "needs a compress= mode"),
    ({"arrays": [np.zeros(3)[::2]]}, ValueError, "C-contiguous"),
])
def test_bad_arguments_raise_at_construction(kwargs, exc, match):
    arrays = kwargs.pop("arrays")
    with pytest.raises(exc, match=match):
        mpicoll.Buckets(arrays, comm=COMM, **kwargs)


def test_grads_cannot_be_rebound_or_written_when_the_arrays_are_the_gradients():
    g = [np.ones(3), np.ones(2)]
    b = mpicoll.Buckets(g, comm=COMM)
    with pytest.raises(TypeError):
        b.grads[0] = np.zeros(3)                   # a tuple
    with pytest.raises(ValueError, match="read-only"):
        b.grads[0][...] = 5.0                      # ready() would copy g[0] over it
    g[0][...] = 7.0                                # the gradient is the array given
    b.ready(0)
    b.ready(1)
    b.wait()
    assert (g[0] == 7.0).all() and (b.grads[0] == 7.0).all()


def test_gradient_as_bucket_view_writes_in_place():
    b = mpicoll.Buckets([np.zeros(3), np.zeros(2)], comm=COMM, gradient_as_bucket_view=True)
    b.grads[1][...] = 3.0
    b.ready(1)
    b.ready(0)
    b.wait()
    assert (b.grads[1] == 3.0).all()
    assert any(np.shares_memory(b.grads[1], f) for f in b.flat)


def test_one_bucket_per_dtype():
    arrays = [np.ones(4, np.float32), np.ones(4, np.float64), np.ones(2, np.float32)]
    b = mpicoll.Buckets(arrays, comm=COMM)
    assert sorted(str(f.dtype) for f in b.flat) == ["float32", "float64"]
    for i in range(3):
        b.ready(i)
    b.wait()
    assert all((a == 1).all() for a in arrays)


def test_a_missed_ready_raises_and_the_next_step_starts_afresh():
    g = [np.ones(3), np.ones(2)]
    b = mpicoll.Buckets(g, comm=COMM, average=False)
    b.ready(0)
    with pytest.raises(ValueError, match=r"did not mark every array ready\(\)"):
        b.wait()
    g[1][...] = 4.0
    b.ready(1)
    b.ready(0)
    b.wait()
    assert (g[1] == 4.0).all()


def test_a_step_that_raised_in_ready_leaves_the_buckets_usable(monkeypatch):
    """A failure inside ready() (here the first bucket's start raises) ends the step: the next
    step runs from the start -- not "array 1 was already marked ready" -- and is right."""
    g = [np.ones(3), np.ones(2)]
    b = mpicoll.Buckets(g, 16, comm=COMM, average=False)        # two buckets: [1], [0]
    start, failed = mpicoll.plan.Prepared.start, []

    def fails_once(*args, **kwargs):
        if not failed:
            failed.append(True)
            raise RuntimeError("the start failed")
        return start(*args, **kwargs)
    monkeypatch.setattr(mpicoll.plan.Prepared, "start", fails_once)
    with pytest.raises(RuntimeError, match="the start failed"):
        b.ready(1)
    g[1][...] = 5.0
    b.ready(1)
    b.ready(0)
    b.wait()
    assert len(b.flat) == 2 and (g[1] == 5.0).all() and (g[0] == 1.0).all()


def test_first_bucket_is_small_the_rest_fused():
    """DDP's layout: the last arrays first, the first bucket capped at first_bucket_bytes
    (1 MiB) so its all-reduce starts early, the rest fused up to bucket_bytes."""
    arrays = [np.zeros(150_000, np.float32) for _ in range(4)]      # 600 kB each
    assert mpicoll.Buckets(arrays, comm=COMM).buckets == [(3,), (2, 1, 0)]
    assert mpicoll.Buckets(arrays, comm=COMM, first_bucket_bytes=4 << 20).buckets == \
        [(3, 2, 1, 0)]
    assert mpicoll.Buckets(arrays, 700_000, comm=COMM).buckets == [(3,), (2,), (1,), (0,)]
