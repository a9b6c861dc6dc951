"""The wire codecs (mpicoll.compression): fp16 gives numpy's float16 bits, bf16 rounds to the
nearest bf16 (ties to even) by an independent float64 check, int8's power-of-two scales are
tight and its rounding is idempotent on any sub-slice, wire sizes are 1/2 and <= 1/4 + scales,
and error feedback keeps exactly the residual."""

import numpy as np
import pytest

import mpicoll
from mpicoll import compression
from mpicoll.compression import CHUNK, CODECS, ErrorFeedback

pytestmark = pytest.mark.timeout(120)


def floats(n, seed=0, finite=True):
    """fp32 values over the whole exponent range, with zeros, ties and extremes salted in."""
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(n) * 10.0 ** rng.integers(-40, 38, n)).astype(np.float32)
    special = np.array([0.0, -0.0, 1.0, 65504, 65519.996, 65520, 1e-8, 2 ** -25, 2 ** -24,
                        3 * 2 ** -26, np.finfo(np.float32).max, np.finfo(np.float32).tiny,
                        1 + 2 ** -8, 1 + 3 * 2 ** -8, 1 + 2 ** -11, 1 + 3 * 2 ** -11], np.float32)
    x[rng.integers(0, n, 200)] = rng.choice(special, 200)
    if not finite:
        x[rng.integers(0, n, 50)] = rng.choice(np.array([np.inf, -np.inf, np.nan], np.float32), 50)
    return x


def roundtrip(codec, x, lo=0):
    wire = np.zeros(codec.wire_bytes(lo, x.size), np.uint8)
    codec.encode(x, lo, wire)
    out = np.empty_like(x)
    codec.decode(wire, lo, out)
    return out


def test_fp16_is_numpys_float16():
    x = floats(200_000, finite=False)
    with np.errstate(all="ignore"):
        want = x.astype(np.float16).astype(np.float32)
    got = roundtrip(CODECS["fp16"], x)
    nan = np.isnan(want)
    assert np.array_equal(np.isnan(got), nan)
    assert np.array_equal(got[~nan].view(np.uint32), want[~nan].view(np.uint32))
    every_half = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    out = np.empty(1 << 16, np.uint32)
    compression.fp16_decode(every_half, out)
    finite = np.isfinite(every_half.view(np.float16))
    assert np.array_equal(out[finite], every_half.view(np.float16)[finite].astype(np.float32)
                          .view(np.uint32))


def test_bf16_rounds_to_nearest_even():
    x = floats(200_000)
    got = roundtrip(CODECS["bf16"], x)
    bits = x.view(np.uint32)
    down = (bits & np.uint32(0xFFFF0000)).view(np.float32).astype(np.float64)
    up_bits = (bits & np.uint32(0xFFFF0000)) + np.uint32(0x10000)
    up = up_bits.view(np.float32).astype(np.float64)
    beyond = np.isinf(up)                   # rounding up past the largest bf16: 2^128 away
    up[beyond] = np.sign(x[beyond]).astype(np.float64) * 2.0 ** 128
    exact = x.astype(np.float64)
    d_down, d_up = np.abs(exact - down), np.abs(up - exact)
    even_down = ((bits >> np.uint32(16)) & np.uint32(1)) == 0
    want = np.where((d_down < d_up) | ((d_down == d_up) & even_down), down, up)
    want[np.abs(want) == 2.0 ** 128] *= np.inf
    assert np.array_equal(got.astype(np.float64), want)
    nan = roundtrip(CODECS["bf16"], np.array([np.nan, -np.nan], np.float32))
    assert np.isnan(nan).all()


@pytest.mark.parametrize("lo", [0, 1, 100, CHUNK - 1, CHUNK, 3 * CHUNK + 17])
def test_int8_scales_are_tight_powers_of_two(lo):
    x = np.random.default_rng(lo).standard_normal(5 * CHUNK + 3).astype(np.float32)
    x[::7] *= 1e-3
    codec = CODECS["int8"]
    wire = np.zeros(codec.wire_bytes(lo, x.size), np.uint8)
    codec.encode(x, lo, wire)
    nchunks = (lo + x.size - 1) // CHUNK - lo // CHUNK + 1
    scales = wire[:4 * nchunks].view(np.float32)
    q = wire[4 * nchunks:].view(np.int8)
    edges = [0] + [c * CHUNK - lo for c in range(lo // CHUNK + 1, (lo + x.size - 1) // CHUNK + 1)] \
        + [x.size]
    assert len(edges) - 1 == nchunks
    for c, (a, b) in enumerate(zip(edges, edges[1:])):
        s, amax = float(scales[c]), float(np.abs(x[a:b]).max())
        assert s == 2.0 ** round(np.log2(s))                     # a power of two
        assert amax / 127 <= s < 2 * amax / 127                  # the smallest that fits
        assert np.abs(q[a:b]).max() <= 127
        assert np.abs(q[a:b] * s - x[a:b]).max() <= s / 2        # round to nearest
    got = roundtrip(codec, x, lo)
    r = x.copy()
    codec.round(r, lo)
    assert np.array_equal(got.view(np.uint32), r.view(np.uint32))


@pytest.mark.parametrize("name", sorted(CODECS))
def test_rounding_is_idempotent_on_any_slice(name):
    """What a sender keeps equals what a forwarder sends on: R(R(x)) == R(x), on sub-slices at
    any offset too (int8: chunks sit at absolute offsets)."""
    codec = CODECS[name]
    x = np.random.default_rng(3).standard_normal(10 * CHUNK).astype(np.float32)
    x *= 10.0 ** np.random.default_rng(4).integers(-3, 3, x.size)
    r = x.copy()
    codec.round(r, 0)
    for lo, hi in [(0, x.size), (5, 700), (CHUNK, 2 * CHUNK), (CHUNK + 1, CHUNK + 2), (1000, 2559)]:
        again = roundtrip(codec, r[lo:hi], lo)
        assert np.array_equal(again.view(np.uint32), r[lo:hi].view(np.uint32)), (lo, hi)


@pytest.mark.parametrize("name", sorted(CODECS))
def test_fused_passes_equal_the_codecs_steps(name):
    """The one-pass kernels the progress executor runs give the bits of the steps they fuse:
    send = encode, then decode into the sender's copy; add = decode, then the fp32 sum in
    either operand order; feedback = x / divide + e, round, the residual (non-finite values too,
    except int8, whose inputs must be finite)."""
    codec, lo = CODECS[name], 37
    x = floats(10 * CHUNK + 3, seed=8, finite=name != "int8")
    if name == "int8":
        x = np.random.default_rng(8).standard_normal(x.size).astype(np.float32)
    cuts = compression.cuts(lo + x.size, (lo + 300, lo + 301, lo + 999))
    bits = lambda a: a.view(np.uint32)                                 # noqa: E731

    wire, kept = np.zeros(codec.wire_bytes(lo, x.size, cuts), np.uint8), x.copy()
    codec.send(kept, lo, wire, cuts)
    want_wire = np.zeros_like(wire)
    codec.encode(x, lo, want_wire, cuts)
    decoded = np.empty_like(x)
    codec.decode(want_wire, lo, decoded, cuts)
    assert np.array_equal(wire, want_wire) and np.array_equal(bits(kept), bits(decoded))

    acc0 = floats(x.size, seed=9, finite=name != "int8")
    for left in (False, True):
        acc = acc0.copy()
        codec.add(wire, lo, acc, left, cuts)
        want = decoded + acc0 if left else acc0 + decoded
        assert np.array_equal(bits(acc), bits(want)), left

    e0 = (x * np.float32(1e-3)).astype(np.float32)
    for divide in (1, 3):
        got, e = x.copy(), e0.copy()
        codec.feedback(got, e, None, divide)
        with np.errstate(over="ignore", invalid="ignore"):
            v = x / np.float32(divide) + e0
            r = v.copy()
            codec.round(r, 0)
            assert np.array_equal(bits(got), bits(r)) and np.array_equal(bits(e), bits(v - r))

    # send and add with the feedback in the same pass: as feedback on the slice, then the op
    # (the slice at offset lo: int8's pieces follow cuts)
    x, e0 = x[:3 * CHUNK], e0[:3 * CHUNK]
    cuts = compression.cuts(lo + x.size, (lo + 300, lo + 301))
    fed_x, fed_e, fed_wire = x.copy(), e0.copy(), np.zeros(codec.wire_bytes(lo, x.size, cuts),
                                                            np.uint8)
    codec.send(fed_x, lo, fed_wire, cuts, (fed_e, 3))
    want_x, want_e, want_wire = x.copy(), e0.copy(), np.zeros_like(fed_wire)
    with np.errstate(over="ignore", invalid="ignore"):
        codec.feedback(want_x, want_e, cuts, 3, lo)
        codec.send(want_x, lo, want_wire, cuts)
        assert np.array_equal(fed_wire, want_wire) and np.array_equal(bits(fed_x), bits(want_x))
        assert np.array_equal(bits(fed_e), bits(want_e))
        for left in (False, True):
            fed_acc, fed_e = acc0[:x.size].copy(), e0.copy()
            codec.add(want_wire, lo, fed_acc, left, cuts, (fed_e, 3))
            want_acc, want_e = acc0[:x.size].copy(), e0.copy()
            codec.feedback(want_acc, want_e, cuts, 3, lo)
            codec.add(want_wire, lo, want_acc, left, cuts)
            assert np.array_equal(bits(fed_acc), bits(want_acc)), left
            assert np.array_equal(bits(fed_e), bits(want_e)), left


def test_unrounded_slices_follow_the_schedule():
    """Only what a reduction wrote last (or no step sent nor copied in) is left for the final
    rounding: none after ring at 2 ranks, the unsent half after a reduce-scatter's step."""
    from mpicoll import registry
    ring = registry.lookup("allreduce", "ring")
    for rank in range(3):
        sched = ring.schedule(rank, 3, 30)
        assert compression.unrounded(30, sched.plan) == []
    plan = (((1, 0, 5, True, False, 0, -1),), ((1, 5, 10),)),      # send 5:10, reduce 0:5
    assert compression.unrounded(12, plan) == [(0, 5), (10, 12)]
    plan = ((((1, 0, 5, False, False, 0, -1),), ((1, 5, 10),)),)    # copy 0:5, send 5:10
    assert compression.unrounded(12, plan) == [(10, 12)]


def test_first_touches_feed_back_where_a_send_or_reduction_comes_first():
    """Error feedback rides on the op that touches a slice first if it is a send or a
    reduction into the buffer summed from the wire; elsewhere it is added before the run (a
    copy overwrites first; an into_next accumulator is decoded into scratch first)."""
    recv = lambda lo, hi, reduce, at=0, into=-1: (1, lo, hi, reduce, False, at, into)  # noqa
    plan = (((recv(0, 4, False),), ((1, 4, 8),)),      # copy 0:4, send 4:8
            ((recv(8, 10, True),), ((1, 0, 10),)))      # send 0:10, then reduce 8:10
    steps, before = compression.first_touches(12, plan)
    assert steps == (((True,), (False,)), ((False,), (False,)))
    assert before == [(0, 4), (8, 12)]
    plan = (((recv(0, 6, True, 0, 6), recv(0, 6, True, 6)), ()),    # naive's into_next fold
            ((recv(6, 9, True),), ()))
    steps, before = compression.first_touches(9, plan)
    assert steps == (((), (False, False)), ((), (True,))) and before == [(0, 6)]


def test_wire_buffers_are_reused_once_their_request_is_gone():
    """A request gone gives its wire buffers to the next of the same sizes; one that failed
    (an MPI send may still read them) or lives on does not."""
    class Owner:
        pass
    first = Owner()
    a, b = compression.wire_buffers(first, 1000, 2000)
    held = Owner()
    c, = compression.wire_buffers(held, 1000)
    assert c is not a
    del first
    again = Owner()
    a2, b2 = compression.wire_buffers(again, 1000, 2000)
    assert a2 is a and b2 is b
    compression.failed(again)
    del again
    fresh = Owner()
    a3, = compression.wire_buffers(fresh, 1000)
    assert a3 is not a and a3 is not c and a3.size == 1000 and a3.dtype == np.uint8


def test_wire_bytes_are_half_and_a_quarter_plus_scales():
    for n in (1, 255, 256, 257, 10_000, 1 << 20):
        assert CODECS["bf16"].wire_bytes(0, n) == CODECS["fp16"].wire_bytes(7, n) == 2 * n
        assert CODECS["int8"].wire_bytes(0, n) == n + 4 * -(-n // CHUNK)
        assert CODECS["int8"].wire_bytes(0, n) <= n + 4 * (n // CHUNK + 1)
    assert CODECS["int8"].wire_bytes(CHUNK - 1, 2) == 2 + 8                # crosses a chunk edge


def test_int8_non_finite_chunk_decodes_as_nan():
    x = np.ones(2 * CHUNK, np.float32)
    x[3] = np.inf
    got = roundtrip(CODECS["int8"], x)
    assert np.isnan(got[:CHUNK]).all() and np.array_equal(got[CHUNK:], x[CHUNK:])


def test_error_feedback_keeps_the_residual():
    """After K calls, what was sent plus the residual is what was given (up to fp32 sums), and
    the residual stays below half a quantum; without feedback the small values are lost."""
    codec, n, K = CODECS["int8"], 3 * CHUNK, 50
    rng = np.random.default_rng(5)
    ef = ErrorFeedback(n)
    given = np.zeros(n, np.float64)
    sent = np.zeros(n, np.float64)
    plain = np.zeros(n, np.float64)
    for _ in range(K):
        g = (2e-3 + rng.standard_normal(n) * 1e-4).astype(np.float32)   # a small steady pull
        g[::CHUNK] = 1.0                    # one large value per chunk: the small ones round to 0
        given += g
        r = g.copy()
        codec.round(r)
        plain += r
        x = g.copy()
        ef.apply(codec, x)
        sent += x
    assert np.abs(given - (sent + ef.residual)).max() < 1e-5
    assert np.abs(ef.residual).max() <= 2.0 ** -6 / 2        # amax 1: scale 2^-6 >= 1/127
    assert np.abs(given - sent).max() < np.abs(given - plain).max() / 5
    with pytest.raises(ValueError, match="holds 768"):
        ef.apply(codec, np.zeros(10, np.float32))
    for bad in (0, -2, np.inf, True, "2"):
        with pytest.raises(ValueError, match="divide must be a finite number > 0"):
            ErrorFeedback(n, divide=bad)


def test_argument_errors_name_the_problem():
    from mpi4py import MPI
    x = np.ones(8, np.float32)
    with pytest.raises(ValueError, match="compress must be None or one of"):
        mpicoll.allreduce(x, compress="fp8", comm=MPI.COMM_SELF)
    with pytest.raises(ValueError, match="float32 data and op='sum'"):
        mpicoll.allreduce(np.ones(8), compress="bf16", comm=MPI.COMM_SELF)
    with pytest.raises(ValueError, match="needs a compress= mode"):
        mpicoll.allreduce(x, error_feedback=ErrorFeedback(8), comm=MPI.COMM_SELF)
    with pytest.raises(ValueError, match="holds 4 elements"):
        mpicoll.allreduce(x, compress="int8", error_feedback=ErrorFeedback(4),
                          comm=MPI.COMM_SELF)
    with pytest.raises(ValueError, match="not the MPI library's own"):
        mpicoll.iallreduce(x, compress="int8", algorithm="mpi", comm=MPI.COMM_SELF)
    with pytest.raises(ValueError, match="average=True needs op='sum'"):
        mpicoll.Buckets([x], op="max")
    with pytest.raises(ValueError, match="not marked ready"):
        mpicoll.Buckets([x, x], comm=MPI.COMM_SELF).wait()


def test_single_rank_calls_complete_at_once():
    from mpi4py import MPI
    x = np.arange(6, dtype=np.float32)
    req = mpicoll.iallreduce(x, compress="bf16", comm=MPI.COMM_SELF)
    assert req.done and req.test() and np.array_equal(req.wait(), x)
    b = mpicoll.Buckets([np.zeros((2, 3), np.float32), np.zeros(4, np.float32)], 16,
                        comm=MPI.COMM_SELF, gradient_as_bucket_view=True)
    assert [len(m) for m in b.buckets] == [1, 1] and b.buckets[0] == (1,)
    b.grads[0][...] = 2.0
    b.ready(1)
    b.ready(0)
    b.wait()
    assert (b.grads[0] == 2.0).all()
    assert np.shares_memory(b.grads[0], b.flat[1])

