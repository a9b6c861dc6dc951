"""The "mpicoll" torch backend under mpiexec (N = 2 and 4): every supported collective against
closed forms, in place and without a copy, the errors, async futures, and DDP -- the same
weights as on Gloo, bit-identical twice with the algorithm fixed."""

import time

import numpy as np
import pytest
import torch
import torch.distributed as dist

import mpicoll
import mpicoll.torch
from mpicoll import registry
from mpicoll.testing import agree, ddp_train

pytestmark = pytest.mark.mpi

DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int32, torch.int64,
          torch.uint8]
OPS = {"SUM": dist.ReduceOp.SUM, "PRODUCT": dist.ReduceOp.PRODUCT, "MIN": dist.ReduceOp.MIN,
       "MAX": dist.ReduceOp.MAX, "BAND": dist.ReduceOp.BAND, "BOR": dist.ReduceOp.BOR,
       "BXOR": dist.ReduceOp.BXOR, "AVG": dist.ReduceOp.AVG}


def expected(op: str, values: list, dtype):
    if op == "SUM":
        return sum(values)
    if op == "AVG":
        return sum(values) / len(values)
    if op == "PRODUCT":
        return int(np.prod(values))
    if op in ("MIN", "MAX"):
        return min(values) if op == "MIN" else max(values)
    out = values[0]
    for v in values[1:]:
        out = {"BAND": out & v, "BOR": out | v, "BXOR": out ^ v}[op]
    return out


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_all_reduce_ops_and_dtypes_in_place(world, dtype):
    """Every op, blocking and async, on one dtype; every failure is reported (one agreement
    step per dtype keeps the suite short on a loaded machine)."""
    rank, size = world.Get_rank(), world.Get_size()
    values = [r % 3 + 1 for r in range(size)]     # small: PRODUCT fits uint8, fp16 exact
    floating, problems = dtype.is_floating_point, []
    for op in OPS:
        if op in ("BAND", "BOR", "BXOR") and floating or op == "AVG" and not floating:
            try:
                dist.all_reduce(torch.ones(3, dtype=dtype), op=OPS[op])
                problems.append(f"{op} on {dtype} did not raise TypeError")
            except TypeError:
                pass
            continue
        for async_op in (False, True):
            x = torch.full((1001,), values[rank], dtype=dtype)
            address = x.data_ptr()
            work = dist.all_reduce(x, op=OPS[op], async_op=async_op)
            if async_op and not (work.wait() is True and work.get_future().wait()[0] is x):
                problems.append(f"{op} async: wait/future")
            want = torch.full((1001,), expected(op, values, dtype), dtype=torch.float64)
            if x.data_ptr() != address or not torch.equal(x.double(), want):
                problems.append(f"{op} async={async_op}: got {x[:3].tolist()}, want "
                                f"{want[:3].tolist()}")
    agree(world, not problems, f"{dtype}: " + "; ".join(problems))


def test_bool_ops_are_logical(world):
    rank, size = world.Get_rank(), world.Get_size()
    x = torch.tensor([rank == 0, True, False])
    dist.all_reduce(x, op=dist.ReduceOp.BAND)
    y = torch.tensor([rank == 0, True, False])
    dist.all_reduce(y, op=dist.ReduceOp.SUM)
    agree(world, x.tolist() == [size == 1, True, False] and y.tolist() == [True, True, False],
          f"{x.tolist()} {y.tolist()}")


@pytest.mark.parametrize("async_op", [False, True])
def test_gathers_scatters_broadcast(world, async_op):
    rank, size = world.Get_rank(), world.Get_size()
    n, problems = 5, []
    out = torch.empty(size * n)
    dist.all_gather_into_tensor(out, torch.full((n,), float(rank)), async_op=async_op) \
        if not async_op else dist.all_gather_into_tensor(
            out, torch.full((n,), float(rank)), async_op=True).wait()
    if not torch.equal(out, torch.arange(size).repeat_interleave(n).float()):
        problems.append(f"all_gather_into_tensor {out.tolist()}")
    outs = [torch.empty(2, 3, dtype=torch.int64) for _ in range(size)]
    w = dist.all_gather(outs, torch.full((2, 3), rank, dtype=torch.int64), async_op=async_op)
    if async_op:
        w.wait()
    if [int(o[1, 2]) for o in outs] != list(range(size)):
        problems.append(f"all_gather {outs}")
    o = torch.empty(n)
    w = dist.reduce_scatter_tensor(o, torch.arange(size * n, dtype=torch.float32) * (rank + 1),
                                   async_op=async_op)
    if async_op:
        w.wait()
    scale = size * (size + 1) // 2
    if not torch.equal(o, torch.arange(rank * n, (rank + 1) * n).float() * scale):
        problems.append(f"reduce_scatter_tensor {o.tolist()}")
    o = torch.empty(n, dtype=torch.float64)
    w = dist.reduce_scatter(o, [torch.full((n,), float(r * 10 + rank), dtype=torch.float64)
                                for r in range(size)], op=dist.ReduceOp.MAX, async_op=async_op)
    if async_op:
        w.wait()
    if not torch.equal(o, torch.full((n,), float(rank * 10 + size - 1), dtype=torch.float64)):
        problems.append(f"reduce_scatter MAX {o.tolist()}")
    ts = [torch.ones(3) * (rank + 1), torch.ones(2, 2) * 2]
    w = dist.all_reduce_coalesced(ts, async_op=async_op)
    if async_op:
        w.wait()
    if ts[0].tolist() != [scale] * 3 or ts[1].flatten().tolist() != [2.0 * size] * 4:
        problems.append(f"all_reduce_coalesced {ts}")
    b = torch.full((7,), float(rank), dtype=torch.bfloat16)
    w = dist.broadcast(b, src=size - 1, async_op=async_op)
    if async_op:
        w.wait()
    if b.tolist() != [float(size - 1)] * 7:
        problems.append(f"broadcast {b.tolist()}")
    dist.barrier()
    agree(world, not problems, "; ".join(problems))


def test_in_flight_requests_complete_their_futures_without_wait(world):
    """DDP's pattern: several async all-reduces, then only future.wait() (no Work.wait)."""
    size = world.Get_size()
    xs = [torch.full((1 << k,), 1.0) for k in range(4, 16, 2)]
    futures = [dist.all_reduce(x, async_op=True).get_future() for x in xs]
    chained = futures[-1].then(lambda f: f.value()[0].sum().item())
    torch.futures.wait_all(futures)
    agree(world, all(torch.all(x == size) for x in xs) and chained.wait() == size * (1 << 14),
          "wrong sums")


def test_the_future_of_a_finished_work(world):
    """A Work makes its future when asked (a blocking call never asks): asked after the end,
    it comes completed, with the tensors, or with the failure; asked before (async), the end
    completes it, and a callback chained on it runs."""
    size, group = world.Get_size(), dist.group.WORLD
    x = torch.ones(8)
    opts = dist.AllreduceOptions()
    opts.asyncOp = False
    work = group.allreduce([x], opts)                  # blocking: done on return
    done = work.get_future()
    ok = done.done() and done.wait()[0] is x and torch.all(x == size).item()
    ok = ok and work.get_future() is done              # one future per Work
    y = torch.ones(8)
    work = dist.all_reduce(y, async_op=True)           # asked before the end
    chained = work.get_future().then(lambda f: f.value()[0].sum().item())
    ok = ok and chained.wait() == 8 * size and work.wait() is True
    failed = mpicoll.torch.backend.Work("all_reduce", error=ValueError("a test's failure"))
    future = failed.get_future()
    ok = ok and future.done()                          # (never wait on one left pending)
    try:
        future.wait() if future.done() else None
        ok = False
    except RuntimeError as exc:
        ok = ok and "a test's failure" in str(exc)
    agree(world, ok, "futures of finished works")


def test_bad_tensors_raise_before_communication(world):
    with pytest.raises(ValueError, match="not contiguous"):
        dist.all_reduce(torch.ones(4, 4).t())
    with pytest.raises(TypeError, match="meta.*CPU tensors"):
        dist.all_reduce(torch.ones(4, device="meta"))
    with pytest.raises(TypeError, match="AVG needs a floating-point"):
        dist.all_reduce(torch.ones(4, dtype=torch.int32), op=dist.ReduceOp.AVG)
    with pytest.raises(ValueError, match="output has 3 elements"):
        dist.all_gather_into_tensor(torch.empty(3), torch.ones(world.Get_size() + 2))
    # a lazy negative view shows -1 where its memory holds 1: written in place, the result
    # would land in a copy; read only (a gather's input), the values shown are sent
    for dtype in (torch.float32, torch.bfloat16):      # (bfloat16: viewed through int16)
        lazy = torch._neg_view(torch.ones(3, dtype=dtype))
        with pytest.raises(ValueError, match="lazy negative view.*resolve_neg"):
            dist.all_reduce(lazy)
        out = torch.empty(3 * world.Get_size(), dtype=dtype)
        dist.all_gather_into_tensor(out, lazy)
        assert torch.all(out == -1)
    dist.barrier()          # the communicator is still good


@pytest.mark.parametrize("call,name", [
    (lambda: dist.reduce(torch.ones(2), dst=0), "reduce"),
    (lambda: dist.all_to_all_single(torch.empty(4), torch.ones(4)), "all_to_all_single"),
    (lambda: dist.send(torch.ones(2), dst=(dist.get_rank() + 1) % dist.get_world_size()),
     "send"),
    (lambda: dist.gather(torch.ones(2), [torch.empty(2) for _ in range(dist.get_world_size())]
                         if dist.get_rank() == 0 else None, dst=0), "gather"),
    (lambda: dist.all_reduce(torch.ones(2), op=dist.ReduceOp.PREMUL_SUM), None),
    (lambda: dist.monitored_barrier(), "monitored_barrier"),      # (torch's own: ValueError)
])
def test_unsupported_ops_name_themselves(world, call, name):
    if name is None:        # torch refuses PREMUL_SUM itself for a non-NCCL backend, or we do
        with pytest.raises((NotImplementedError, ValueError, RuntimeError, TypeError)):
            call()
        return
    with pytest.raises(NotImplementedError, match=rf"does not implement {name}\b"):
        call()


def test_options_reach_mpicoll(world):
    """pg_options: the algorithm of a new group; a bad algorithm is mpicoll's ValueError."""
    group = dist.new_group(backend="mpicoll",
                           pg_options=mpicoll.torch.Options(algorithm="ring", timeout=30))
    assert "'ring'" in repr(group) and "timeout=30" in repr(group)
    x = torch.ones(100)
    dist.all_reduce(x, group=group)
    group.options.algorithm = "no_such_algorithm"
    with pytest.raises(ValueError, match="no_such_algorithm"):
        dist.all_reduce(x, group=group)
    agree(world, torch.all(x == world.Get_size()), "sum")


def test_options_algorithm_means_what_comm_s_means(world):
    """Options.algorithm reads as mpicoll.Comm's (registry.per_collective): a name applies to
    every collective that has it, a dict names them one by one; an algorithm whose nonblocking
    form is only deferred (shm: Algorithm.deferred) runs blocking, async_op or not."""
    seen = []
    for setting in ("ring", "recursive_doubling", "binomial", "shm",
                    {"bcast": "binomial", "allgather": "ring"}):
        options, comm = mpicoll.torch.Options(algorithm=setting), mpicoll.Comm(world, setting)
        seen += [(setting, c, options.algorithm_for(c), comm.algorithm_for(c))
                 for c in registry.COLLECTIVES]
    differ = [s for s in seen if s[2] != s[3]]
    rd = {c: a for s, c, a, _ in seen if s == "recursive_doubling"}
    group = dist.new_group(backend="mpicoll", pg_options=mpicoll.torch.Options(algorithm="shm"))
    x = torch.ones(10)
    work = dist.all_reduce(x, group=group, async_op=True)
    finished_at_return = work.is_completed()
    work.wait()
    agree(world, not differ and rd == {"allreduce": "recursive_doubling", "allgather":
                                       "recursive_doubling", "reduce_scatter_block": "auto",
                                       "bcast": "auto"}
          and finished_at_return and torch.all(x == world.Get_size()),
          f"{differ} {rd} {finished_at_return} {x[:3]}")


def test_reproducible_option(world):
    """Options(reproducible=True): float SUM and AVG all-reduces and reduce-scatters have the bits
    of mpicoll's reproducible sum (the same with ring and recursive_doubling), in place, blocking
    and async; MAX and integer sums run as usual; a float PRODUCT is a ValueError."""
    from mpicoll import reproducible as R
    size, rank = world.Get_size(), world.Get_rank()
    rng = np.random.default_rng(11)
    rows = (10.0 ** rng.uniform(-8, 8, (size, 4099)) * rng.choice([-1, 1], (size, 4099)))
    whole_sum = np.asarray(R.sum(rows.astype(np.float32)))
    want = whole_sum.view(np.uint32)
    bad = []
    for algorithm in ("ring", "recursive_doubling"):
        group = dist.new_group(backend="mpicoll", pg_options=mpicoll.torch.Options(
            algorithm={"allreduce": algorithm, "reduce_scatter_block": "ring"},
            reproducible=True))
        for async_op in (False, True):
            x = torch.from_numpy(rows[rank].astype(np.float32))
            work = dist.all_reduce(x, group=group, async_op=async_op)
            if async_op:
                work.wait()
            if not np.array_equal(x.numpy().view(np.uint32), want):
                bad.append(f"{algorithm} all_reduce async={async_op}")
        x = torch.from_numpy(rows[rank].astype(np.float32))
        dist.all_reduce(x, op=dist.ReduceOp.AVG, group=group)
        if not torch.equal(x, torch.from_numpy(whole_sum.copy()) / size):
            bad.append(f"{algorithm} AVG")
        n = 7
        block = torch.from_numpy(rows[:, :n * size].astype(np.float32)[rank].copy())
        out = torch.empty(n)
        dist.reduce_scatter_tensor(out, block, group=group)
        whole = np.asarray(R.sum(rows[:, :n * size].astype(np.float32)))
        if not np.array_equal(out.numpy(), whole[rank * n:(rank + 1) * n]):
            bad.append(f"{algorithm} reduce_scatter_tensor")
        top = torch.from_numpy(rows[rank].astype(np.float32))
        dist.all_reduce(top, op=dist.ReduceOp.MAX, group=group)
        if not np.array_equal(top.numpy(), rows.astype(np.float32).max(axis=0)):
            bad.append(f"{algorithm} MAX")
        ints = torch.full((3,), rank, dtype=torch.int64)
        dist.all_reduce(ints, group=group)
        if not torch.all(ints == size * (size - 1) // 2):
            bad.append(f"{algorithm} int64 SUM")
        with pytest.raises(ValueError, match="PRODUCT"):
            dist.all_reduce(torch.ones(3), op=dist.ReduceOp.PRODUCT, group=group)
    agree(world, not bad, bad)


def test_subgroup(world):
    size, rank = world.Get_size(), world.Get_rank()
    if size < 2:
        pytest.skip("needs 2 ranks")
    members = list(range(0, size, 2))
    group = dist.new_group(members, backend="mpicoll")
    x = torch.full((3,), float(rank))
    if rank in members:
        dist.all_reduce(x, group=group)
    want = float(sum(members)) if rank in members else float(rank)
    agree(world, torch.all(x == want), f"{x.tolist()} != {want}")


@pytest.mark.parametrize("async_op", [False, True])
def test_avg_on_one_rank_and_sum_on_the_others_is_a_mismatch(world, async_op):
    """ReduceOp.AVG on rank 0, SUM on the others (it used to give the average there and the
    sum elsewhere, silently): AVG is mpicoll's average=True, a field of the call's signature,
    so every rank raises (the ArgumentMismatch naming it) within 2 s, on a group of its own
    (the mismatch breaks its communicator)."""
    if world.Get_size() < 2:
        pytest.skip("needs 2 ranks")
    group = dist.new_group(backend="mpicoll")
    dist.all_reduce(torch.ones(4), group=group)     # (the group's first call sets it up)
    op = dist.ReduceOp.AVG if world.Get_rank() == 0 else dist.ReduceOp.SUM
    x = torch.full((4,), float(world.Get_rank() + 1))
    start = time.monotonic()
    try:
        dist.all_reduce(x, op=op, group=group, async_op=async_op).wait()
        got = None
    except RuntimeError as exc:
        got = exc
    elapsed = time.monotonic() - start
    ok = (got is not None and isinstance(got.__cause__, mpicoll.ArgumentMismatch)
          and "average" in str(got) and elapsed < 2.0)
    agree(world, ok, f"{type(got).__name__}: {got} after {elapsed:.2f} s")


def test_small_async_all_reduces_run_a_kept_call(world):
    """An async all_reduce of a small tensor runs the call kept for its memory, shape, dtype,
    op and algorithm (made by the first), each a new call: the right sums every time, one kept
    call per key; a new algorithm or settings.reload() makes another; a tensor above SMALL
    bytes runs none."""
    rank, size = world.Get_rank(), world.Get_size()
    group = dist.new_group(backend="mpicoll")
    x, problems = torch.zeros(3), []
    for k in range(6):
        x.fill_(rank + k)
        op = dist.ReduceOp.MAX if k % 2 else dist.ReduceOp.SUM
        work = dist.all_reduce(x, op=op, group=group, async_op=True)
        if work.wait() is not True or work.get_future().wait()[0] is not x:
            problems.append(f"call {k}: wait/future")
        want = size - 1 + k if k % 2 else sum(range(size)) + size * k
        if x.tolist() != [want] * 3:
            problems.append(f"call {k}: {x.tolist()}, want {want}")
    kept = {key[3] for key in group._kept}
    group.options.algorithm = "ring"
    dist.all_reduce(x, group=group, async_op=True).wait()
    mpicoll.settings.reload()
    dist.all_reduce(x, group=group, async_op=True).wait()
    large = torch.ones(mpicoll.torch.backend.SMALL // 4 + 1)
    dist.all_reduce(large, group=group, async_op=True).wait()
    algorithms = [key[4] for key in group._kept]
    agree(world, not problems and kept == {"sum", "max"} and len(group._kept) == 4
          and algorithms.count("ring") == 2 and torch.all(large == size).item(),
          f"{problems} {kept} {list(group._kept)}")


def test_a_kept_call_is_agreed_as_any(world):
    """Rank 0 passes MAX where the others pass SUM, on a tensor whose kept calls for both ops
    exist: every rank raises the ArgumentMismatch (on a group of its own: it breaks it)."""
    if world.Get_size() < 2:
        pytest.skip("needs 2 ranks")
    group = dist.new_group(backend="mpicoll")
    x = torch.ones(4)
    dist.all_reduce(x, group=group)                 # (the group's first call sets it up)
    for op in (dist.ReduceOp.SUM, dist.ReduceOp.MAX):
        dist.all_reduce(x, op=op, group=group, async_op=True).wait()
    op = dist.ReduceOp.MAX if world.Get_rank() == 0 else dist.ReduceOp.SUM
    try:
        dist.all_reduce(x, op=op, group=group, async_op=True).wait()
        got = None
    except RuntimeError as exc:
        got = exc
    agree(world, len(group._kept) == 2 and got is not None
          and isinstance(got.__cause__, mpicoll.ArgumentMismatch), f"{got!r}")


# ----------------------------------------------------------------------------- DDP

def relative(a, b) -> float:
    """max |a - b| / max |b|."""
    return float((a - b).abs().max() / b.abs().max())


def test_ddp_matches_gloo(world, gloo):
    """50 DDP steps on "mpicoll" end with Gloo's weights, to 1e-6 relative (fp32); every rank
    holds the same bits."""
    ours, _ = ddp_train(steps=50)
    theirs, _ = ddp_train(gloo, steps=50)
    gathered = world.allgather(ours.numpy().tobytes())
    rel = relative(ours, theirs)
    agree(world, rel <= 1e-6 and len(set(gathered)) == 1,
          f"relative difference {rel:.3e}, ranks agree: {len(set(gathered)) == 1}")


def test_ddp_fixed_algorithm_is_bit_identical(world):
    runs = []
    for _ in range(2):
        group = dist.new_group(backend="mpicoll",
                               pg_options=mpicoll.torch.Options(algorithm="ring"))
        runs.append(ddp_train(group, steps=50)[0])
    agree(world, torch.equal(runs[0], runs[1]),
          f"max difference {float((runs[0] - runs[1]).abs().max()):.3e}")


@pytest.mark.parametrize("mode", ["bf16", "int8"])
def test_ddp_compress_hook(world, gloo, mode):
    """The hook trains to nearly Gloo's weights; all ranks hold the same bits."""
    ours, _ = ddp_train(steps=20, hook=mpicoll.torch.compress_hook(mode, error_feedback=True))
    theirs, _ = ddp_train(gloo, steps=20)
    rel = relative(ours, theirs)
    gathered = world.allgather(ours.numpy().tobytes())
    agree(world, 0 < rel < 0.05 and len(set(gathered)) == 1,
          f"{mode}: relative difference {rel:.3e}, ranks agree {len(set(gathered)) == 1}")
