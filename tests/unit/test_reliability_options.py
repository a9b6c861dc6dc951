"""The reliability options, on one process: parsing, defaults, the error messages."""

import inspect
import math

import numpy as np
import pytest
from mpi4py import MPI

import mpicoll
from mpicoll import settings
from mpicoll._runtime import context, tags, validate, watch
from mpicoll._runtime.call import Call
from mpicoll.errors import ArgumentMismatch, CollectiveTimeout
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
    ("MPICOLL_TIMEOUT", "soon", "MPICOLL_TIMEOUT must be a number of seconds > 0, or 0 or inf "
                                "for no timeout, got 'soon'"),
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
    for off in ("inf", "0", "0.0"):
        with environment(MPICOLL_TIMEOUT=off):
            assert Call("allreduce", "auto", COMM, None, None, None).timeout is None
    with environment(MPICOLL_TIMEOUT="0"):          # the argument still wins
        assert Call("allreduce", "auto", COMM, 3, None, None).timeout == 3.0
    with environment(MPICOLL_TIMEOUT=None, MPICOLL_ON_TIMEOUT=None, MPICOLL_VALIDATE=None):
        call = Call("allreduce", "auto", COMM, None, None, None)
        # the default deadline (settings.DEFAULT_TIMEOUT), as PyTorch's NCCL process groups'
        assert (call.timeout, call.on_timeout, call.validate) == (600.0, "exception", False)
        assert settings.DEFAULT_TIMEOUT == 600.0
        assert Call("allreduce", "auto", COMM, math.inf, None, None).timeout is None


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


def test_mismatch_report_names_in_place_under_auto():
    """auto's all-reduce decides by whether sendbuf is MPI.IN_PLACE, so it is a field: a rank
    in place among ranks with arrays is named; an explicit algorithm leaves it out (-1)."""
    def row(in_place):
        return validate.fingerprint("allreduce", "ring", "sum", np.dtype(np.float64), 10,
                                    in_place=in_place)
    exc = validate.mismatch("allreduce", np.array([row(False), row(True), row(False)]))
    assert exc.ranks == [1]
    assert str(exc).endswith("in_place: a sendbuf array on rank(s) [0, 2], "
                             "sendbuf=MPI.IN_PLACE on rank(s) [1]")
    assert row(None)[validate.FIELDS.index("in_place")] == -1


@pytest.mark.parametrize("tag_ub, calls, hashes", [
    (2**29 - 1, 2**13, 65535),      # this MPICH wheel
    (2**31 - 1, 2**13, 262143),     # Open MPI
    (32767, 128, 255),              # MPI's guaranteed minimum
    (100, 96, 1),                   # too small to share: call numbers only
])
def test_tag_layout(tag_ub, calls, hashes):
    """Tags stay within 0 .. TAG_UB - 5 (TAG_UB, TAG_UB - 1 and TAG_UB - 2 are the roll
    call's, the presence check's and the notices', TAG_UB - 3 and TAG_UB - 4 the failure
    detector's), call numbers and hashes each get their share."""
    layout = tags.tag_space(tag_ub)
    assert (layout.calls, layout.hashes) == (calls, hashes)
    assert layout.tag(calls - 1, hashes - 1) <= tag_ub - 5 and layout.tag(0, 0) == 0
    assert layout.tag(calls + 5, 2**32 - 1) == layout.tag(5, 2**32 - 1)     # wraps
    if hashes > 1:
        assert layout.tag(5, 1) != layout.tag(5, 2) != layout.tag(6, 2)


def test_signature_is_stable_and_cached():
    f64, f32 = np.dtype(np.float64), np.dtype(np.float32)
    a = tags.signature("allreduce", "ring", {"op": "sum", "dtype": f64, "count": 10,
                                             "inner": None})
    assert a.text == "allreduce ring count=10 dtype=float64 op=sum"
    assert a.hashed == 0x6b31a20c and not a.library                 # zlib.crc32: stable
    assert tags.signature("allreduce", "ring", {"op": "sum", "dtype": f64, "count": 10,
                                                "inner": None}) is a
    # the keyword order of the call site does not matter, absent means None
    assert tags.signature("allreduce", "ring", {"count": 10, "dtype": f64, "op": "sum"}).text \
        == a.text
    others = [tags.signature("allreduce", "ring", {"op": "sum", "dtype": f64, "count": 20}),
              tags.signature("allreduce", "ring", {"op": "sum", "dtype": f32, "count": 10}),
              tags.signature("allreduce", "ring", {"op": "max", "dtype": f64, "count": 10}),
              tags.signature("allreduce", "binomial", {"op": "sum", "dtype": f64, "count": 10}),
              tags.signature("bcast", "ring", {"dtype": f64, "count": 10, "root": 1})]
    assert len({a.hashed} | {o.hashed for o in others}) == 6
    assert tags.signature("bcast", "mpi", {"dtype": f64, "count": 10, "root": 0}).library
    assert tags.fields(others[-1].text) == {"collective": "bcast", "algorithm": "ring",
                                            "count": "10", "dtype": "float64", "root": "1"}


def test_roll_call_mismatch_report():
    """The roll call's report: each differing field, with who passed each value."""
    sig = {r: tags.signature("allreduce", "ring", {"op": "sum", "dtype": np.dtype(np.float64),
                                                   "count": 10 * (1 + (r == 1))}).text
           for r in range(3)}
    exc = watch.mismatch("allreduce ring", sig, missing={3}, timeout=5.0)
    assert isinstance(exc, ArgumentMismatch) and exc.in_flight and exc.ranks == [1]
    assert str(exc) == ("allreduce ring: timed out after 5 s: the ranks called it with different "
                        "arguments, so their messages could not match: count: 10 on rank(s) "
                        "[0, 2], 20 on rank(s) [1]; rank(s) [3] did not answer the roll call")
    assert exc.fields == {"count": {"10": [0, 2], "20": [1]}}
    stray = watch.stray_mismatch("bcast binomial", "bcast binomial count=20 root=0", {0: 80},
                                 {0}, 1.0)
    assert stray.ranks == [0] and stray.in_flight
    assert "rank(s) [0] sent this call's messages with other arguments than this rank's " \
           "(collective=bcast algorithm=binomial count=20 root=0)" in str(stray)



def test_mismatch_report_is_in_the_callers_terms():
    """Counts that differ under auto: the count and the algorithm each rank ran, not the
    executor and segment rule that follow from them (the cost model's parameters); those, with
    the setting behind them, only when nothing else differs. The fields table keeps them all."""
    f32 = np.dtype(np.float32)
    rule = "model:1.878e-06/8.36911e-11/2.4641e-11"
    sig = {0: tags.signature("allreduce", "recursive_doubling",
                             {"op": "sum", "dtype": f32, "count": 8, "executor": "compiled",
                              "segments": rule}).text,
           1: tags.signature("allreduce", "shm", {"op": "sum", "dtype": f32,
                                                  "count": 1 << 20, "executor": "shm"}).text}
    exc = watch.mismatch("allreduce recursive_doubling", sig, found=True)
    assert str(exc).endswith("could not match: count: 8 on rank(s) [0], 1048576 on rank(s) [1]; "
                             "algorithm: recursive_doubling on rank(s) [0], shm on rank(s) [1]")
    assert set(exc.fields) == {"algorithm", "count", "executor", "segments"}
    segments = {r: tags.signature("allreduce", "ring", {"count": 8, "segments": s}).text
                for r, s in ((0, "1048576B"), (1, rule))}
    assert str(watch.mismatch("allreduce ring", segments)).endswith(
        "segments (MPICOLL_SEGMENT_BYTES, else the profile's optimum): 1048576 B on rank(s) [0], "
        "the profile's optimum on rank(s) [1]")
    rows = [validate.fingerprint("allreduce", a, "sum", f32, n, executor=e)
            for a, n, e in (("recursive_doubling", 8, "compiled"), ("shm", 1 << 20, "shm"))]
    assert str(validate.mismatch("allreduce", np.array(rows))).endswith(
        "(validate=True): count: 8 on rank(s) [0], 1048576 on rank(s) [1]; algorithm: "
        "recursive_doubling on rank(s) [0], shm on rank(s) [1]")


def test_mismatch_names_a_repeated_call():
    """Rank 0 makes the common call twice, rank 1 once, then both another: at the next call the
    report names rank 0 as repeating its previous call (a likely extra call); no hint when the
    ranks' previous calls do not show that pattern."""
    def sig(count):
        return tags.signature("allreduce", "ring", {"op": "sum", "dtype": np.dtype(np.float64),
                                                    "count": count}).text
    exc = watch.mismatch("allreduce ring", {0: sig(8), 1: sig(4)}, timeout=None, found=True,
                         before={0: sig(8), 1: sig(8)})
    assert f"rank(s) [0] repeat their previous call ({sig(8)}), which rank(s) [1] made last" \
        in str(exc)
    for before in ({0: sig(8), 1: sig(2)}, {0: sig(2), 1: sig(8)}, {}):
        plain = watch.mismatch("allreduce ring", {0: sig(8), 1: sig(4)}, before=before)
        assert "repeat" not in str(plain), before


# ----------------------------------------------------------------------------- issue 22

def test_history_enters_the_tag():
    """Two communicator states that made the same calls give the same tags; one whose earlier
    call differed (a bcast root) gives other tags for every later call, even the same one."""
    from mpicoll._runtime.context import CommState
    f64 = np.dtype(np.float64)
    a, b = CommState(MPI.COMM_SELF), CommState(MPI.COMM_SELF)
    same = tags.signature("allreduce", "ring", {"dtype": f64, "count": 4, "op": "sum"})
    root0 = tags.signature("bcast", "binomial", {"dtype": f64, "count": 4, "root": 0})
    root1 = tags.signature("bcast", "binomial", {"dtype": f64, "count": 4, "root": 1})
    assert a.label(a.next_number(), same) == b.label(b.next_number(), same)
    assert a.label(a.next_number(), root0) != b.label(b.next_number(), root1)
    for _ in range(3):
        ta, tb = a.label(a.next_number(), same), b.label(b.next_number(), same)
        assert ta != tb and ta % a.tags.calls == tb % b.tags.calls    # same number, other hash
    assert a.before.text != b.before.text or a.history != b.history
    assert tags.chain(0, same.hashed) == (same.hashed & 0xFFFFFFFF)


def test_notices_are_judged_by_call():
    """A notice of the call in progress raises PeerError naming the rank and its message; one
    of a call this rank failed too is dropped; one of a later call is kept; one of an earlier,
    completed call only if the sender is broken; relays are named only without a first-hand
    one."""
    from mpicoll._runtime import notice
    from mpicoll._runtime.context import CommState
    st = CommState(MPI.COMM_SELF)
    st.failed_here = {3}
    st.notices = [(1, 3, notice.OWN, "TypeError: x"), (2, 9, notice.OWN, "ValueError: y"),
                  (1, 4, notice.OWN, "TypeError: z")]
    assert notice.judge(st, 5, "allreduce ring") is None
    assert st.notices == [(2, 9, notice.OWN, "ValueError: y")]         # later: kept
    error = notice.judge(st, 9, "allreduce ring")
    assert isinstance(error, mpicoll.PeerError) and error.ranks == [2] and error.call == 9
    assert str(error).startswith("allreduce ring: rank 2 failed in this call: ValueError: y")
    st.notices = [(1, 4, notice.BROKEN, "ArgumentMismatch: w")]        # earlier, broken
    assert notice.judge(st, 5, "bcast binomial").ranks == [1]
    st.notices = [(1, 5, notice.RELAYED, "PeerError: rank 2 ..."), (2, 5, notice.OWN, "TypeError: v")]
    error = notice.judge(st, 5, "allreduce ring")
    assert error.ranks == [2] and "rank 1" not in str(error)
    assert not isinstance(error, mpicoll.ArgumentMismatch)
    # a mismatch another rank found first is this rank's ArgumentMismatch too (shm's window)
    st.notices = [(0, 6, notice.OWN, "ArgumentMismatch: average: on on rank(s) [0]")]
    error = notice.judge(st, 6, "allreduce shm")
    assert isinstance(error, mpicoll.ArgumentMismatch) and isinstance(error, mpicoll.PeerError)
    assert error.ranks == [0] and error.fields == {} and "average" in str(error)
    st.notices = [(0, 7, notice.OWN, "ArgumentMismatch: a"), (2, 7, notice.OWN, "TypeError: b")]
    assert not isinstance(notice.judge(st, 7, "allreduce ring"), mpicoll.ArgumentMismatch)


def test_diverged_report():
    exc = watch.diverged("allreduce ring", {0: "bcast binomial count=4 root=0",
                                            1: "bcast binomial count=4 root=1"}, found=True)
    assert isinstance(exc, mpicoll.ArgumentMismatch) and exc.in_flight
    assert "found while the ranks waited, before the deadline" in str(exc)
    assert "'bcast binomial count=4 root=0' on rank(s) [0]" in str(exc)


def test_a_second_thread_gets_concurrent_call():
    """While one thread is in a call on a communicator (its lock held), another thread's call
    on it raises ConcurrentCall at once, and the communicator is broken (told to the others).
    A call alone on its communicator sends nothing and takes no lock (nothing can pair
    wrongly), so the second thread enters as a call of 2+ ranks does (``context.enter``, which
    ``Call`` and the cached path use; the fault matrix's "threads" rows run it at N = 2, 3)."""
    import threading
    comm = MPI.COMM_SELF.Dup()
    x = np.ones(4)
    mpicoll.allreduce(x, comm=comm)
    st = context.attach(comm)
    got = []
    st.lock.acquire()                                  # "another thread is in a call"
    try:
        worker = threading.Thread(target=lambda: got.append(_raises(context.enter, st,
                                                                    "allreduce")))
        worker.start()
        worker.join(10)
    finally:
        st.lock.release()
    assert got and isinstance(got[0], mpicoll.ConcurrentCall), got
    assert st.broken and "ConcurrentCall" in st.broken
    comm.Free()


def test_callsite_names_the_lines():
    from mpicoll._runtime.call import _callsite

    def helper():
        return _callsite_of()

    def _callsite_of():
        return _callsite()
    site = helper()
    assert site.count("<") >= 1 and "test_reliability_options.py" in site


def _raises(fn, *args, **kwargs):
    try:
        fn(*args, **kwargs)
    except Exception as exc:        # noqa: BLE001
        return exc
    return None
