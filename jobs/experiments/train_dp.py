"""Data-parallel training of a small MLP with mpicoll's gradient buckets: correctness and the
cost of communication, blocking vs bucketed overlap, and each compression mode.

    mpiexec -n 4 python -m mpi4py jobs/experiments/train_dp.py [--steps 300] [--batch 512] [--width 512]
        [--lr 0.05] [--bucket-kib 256] [--repeats 1] [--outdir DIR]

The task (generated, seeded, shipped with the code): 16384 samples of 32 Gaussian features,
labelled by a random "teacher" MLP (10 classes). The model: 32 -> width -> width -> 10, ReLU,
softmax cross-entropy, plain SGD; forward and backward written by hand in numpy, fp32. Each
rank takes B/N samples of the global batch of B; gradients are averaged through
``mpicoll.Buckets``, so N ranks follow the same trajectory as one process on batch B
(tests/jobs/test_training.py checks it to 1e-5, with this job's JSON).

For each configuration the job prints: the mean step time of the slowest rank, split into
compute (forward and backward), exposed communication (time inside ``ready``/``wait``, i.e.
not hidden behind compute; it includes waiting for a slower rank), and the rest (SGD update,
batch slicing); the wire bytes per step (this rank's ``bytes_sent``); and
the loss on the first 4096 training samples after the last step; and how far the weights are
from one process's on the whole batch, |w - w1| / |w1| over all weights (fp32: summation order
only; compressed: the rounding on the wire). Before the table, an overlap probe: a 4 MiB
all-reduce blocking, a numba loop alone, and the loop with an ``iallreduce`` in flight (in place,
as the buckets run; with the progress thread's CPU time per call). Configurations:

* ``blocking``: one bucket, all-reduced after the whole backward pass (no overlap);
* ``bucketed``: ``--bucket-kib`` buckets, each started as soon as its gradients exist;
* ``mpi4py Iallreduce``: the same buckets (``Buckets``' layout), each started as soon as its
  gradients exist with mpi4py's own ``comm.Iallreduce`` (the MPI library's nonblocking
  all-reduce, no mpicoll in the step), all waited for after the backward pass;
* ``bucketed`` with ``compress`` = bf16, fp16, int8 with error feedback, int8 without.

Writes DIR/train_dp.json (default results/); besides the table's columns it keeps, per
configuration, the largest per-array difference from one process's weights
(``max_param_difference``) and whether every rank ends with the same bits (``same_bits``), and
how far one process's weights moved from the start (``single_moved``).
``python jobs/experiments/train_dp.py --table JSON`` prints the table of a recorded run
(docs/training.md's).

Elastic (docs/elastic.md): ``--elastic``, ``--spares S`` (the last S ranks wait as hot spares),
``--kill RANK@STEP`` (that rank calls ``os._exit`` at that step; repeatable) or ``--reproducible``
(micro-batch gradients summed with ``mpicoll.reproducible.sum``, all-reduced with
``reproducible=True``: the same bits at any N) run one configuration under ``mpicoll.elastic.run``,
committing every step, with a global batch of 24 micro-batches of ``--micro`` samples; the job
prints ``weights sha256 <hex>``. ``--checkpoint DIR`` saves the state (``State.save``) every
``--checkpoint-every`` steps, ``--resume DIR`` starts from it, at any rank count;
``--momentum BETA`` adds SGD momentum whose buffer is sharded over the ranks (``elastic.Shard``):

    mpiexec -disable-auto-cleanup -n 4 python -m mpicoll survive \
        python jobs/experiments/train_dp.py --reproducible --kill 2@37 [--micro 16]
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path

for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")        # one BLAS thread per rank: the ranks share cores

import numpy as np                          # noqa: E402

SAMPLES, FEATURES, CLASSES, EVAL = 16384, 32, 10, 4096


# ----------------------------------------------------------------------------- data and model

def make_data(seed: int = 0):
    """(X, y): Gaussian features labelled by a random teacher MLP (plus a little noise)."""
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((SAMPLES, FEATURES)).astype(np.float32)
    t1 = rng.standard_normal((FEATURES, 64)) / np.sqrt(FEATURES)
    t2 = rng.standard_normal((64, CLASSES)) / 8.0
    logits = np.maximum(X @ t1, 0) @ t2 + 0.1 * rng.standard_normal((SAMPLES, CLASSES))
    return X, logits.argmax(1).astype(np.int64)


def init_params(width: int, seed: int = 1) -> list:
    """[W1, b1, W2, b2, W3, b3], fp32, He-initialised."""
    rng = np.random.default_rng(seed)
    sizes = [(FEATURES, width), (width, width), (width, CLASSES)]
    params = []
    for fan_in, fan_out in sizes:
        params.append((rng.standard_normal((fan_in, fan_out)) * np.sqrt(2 / fan_in))
                      .astype(np.float32))
        params.append(np.zeros(fan_out, np.float32))
    return params


def loss_of(params, X, y) -> float:
    W1, b1, W2, b2, W3, b3 = params
    h = np.maximum(np.maximum(X @ W1 + b1, 0) @ W2 + b2, 0)
    z = h @ W3 + b3
    z = z - z.max(1, keepdims=True)
    return float(np.mean(np.log(np.exp(z).sum(1)) - z[np.arange(len(y)), y]))


def forward_backward(params, X, y, grads, ready) -> float:
    """Loss of the batch; writes d(mean loss)/d(param i) into grads[i], calling ready(i) as
    soon as each is written (last layer first, as a backward pass produces them)."""
    W1, b1, W2, b2, W3, b3 = params
    z1 = X @ W1 + b1
    h1 = np.maximum(z1, 0)
    z2 = h1 @ W2 + b2
    h2 = np.maximum(z2, 0)
    z = h2 @ W3 + b3
    z -= z.max(1, keepdims=True)
    p = np.exp(z)
    s = p.sum(1, keepdims=True)
    rows = np.arange(len(y))
    loss = float(np.mean(np.log(s[:, 0]) - z[rows, y]))
    p /= s
    p[rows, y] -= 1
    p /= len(y)                                         # d loss / d logits
    np.matmul(h2.T, p, out=grads[4]); ready(4)          # noqa: E702
    np.sum(p, axis=0, out=grads[5]); ready(5)           # noqa: E702
    d2 = p @ W3.T
    d2 *= z2 > 0
    np.matmul(h1.T, d2, out=grads[2]); ready(2)         # noqa: E702
    np.sum(d2, axis=0, out=grads[3]); ready(3)          # noqa: E702
    d1 = d2 @ W2.T
    d1 *= z1 > 0
    np.matmul(X.T, d1, out=grads[0]); ready(0)          # noqa: E702
    np.sum(d1, axis=0, out=grads[1]); ready(1)          # noqa: E702
    return loss


# ----------------------------------------------------------------------------- training

def train(comm=None, *, steps: int, batch: int, width: int = 512, lr: float = 0.1,
          mode: str = "bucketed", bucket_bytes: int = 256 << 10, compress=None,
          error_feedback: bool = False, seed: int = 0, data=None) -> dict:
    """Train for ``steps``; ``comm=None`` is one process on the whole batch (no mpicoll).

    Returns {"params", "losses" (this rank's batch losses), "times" (per step: total,
    compute, comm), "bytes_sent" (this rank, whole run), "final_loss"}.
    """
    import mpicoll
    from mpicoll.testing import traffic

    X, y = make_data(seed) if data is None else data
    params = init_params(width, seed + 1)
    size, rank = (1, 0) if comm is None else (comm.Get_size(), comm.Get_rank())
    if batch % size:
        raise ValueError(f"batch {batch} is not a multiple of the {size} ranks")
    local = batch // size
    order = np.random.default_rng(seed + 2).permutation(SAMPLES)
    if comm is None:
        grads = [np.empty_like(p) for p in params]
        buckets = None
    elif mode == "mpi4py Iallreduce":
        buckets = MpiBuckets(params, bucket_bytes, comm)
        grads = buckets.grads
    else:
        one = mode == "blocking"
        whole = 1 << 62                 # blocking: one bucket, the first too
        buckets = mpicoll.Buckets(params, whole if one else bucket_bytes, average=True,
                                  first_bucket_bytes=whole if one else bucket_bytes,
                                  comm=comm, compress=compress, error_feedback=error_feedback,
                                  gradient_as_bucket_view=True)
        grads = buckets.grads
    comm_time = 0.0

    def ready(i):
        nonlocal comm_time
        if buckets is not None and mode != "blocking":
            t = time.perf_counter()
            buckets.ready(i)
            comm_time += time.perf_counter() - t

    sent0 = traffic(comm)["bytes_sent"] if comm is not None else 0
    losses, times = [], []
    for step in range(steps):
        t0 = time.perf_counter()
        comm_time = 0.0
        start = (step * batch) % SAMPLES
        idx = order[start + rank * local:start + (rank + 1) * local]
        xb, yb = X[idx], y[idx]
        t1 = time.perf_counter()
        losses.append(forward_backward(params, xb, yb, grads, ready))
        t2 = time.perf_counter()
        compute = t2 - t1 - comm_time
        if buckets is not None:
            if mode == "blocking":
                for i in range(len(params)):
                    buckets.ready(i)
            buckets.wait()
        t3 = time.perf_counter()
        comm_time += t3 - t2
        for p, g in zip(params, grads):
            p -= lr * g
        times.append((time.perf_counter() - t0, compute, comm_time))
    sent = (traffic(comm)["bytes_sent"] - sent0) if comm is not None else 0
    return {"params": params, "losses": losses, "times": np.array(times), "bytes_sent": sent,
            "final_loss": loss_of(params, X[:EVAL], y[:EVAL])}


class MpiBuckets:
    """``Buckets``' ``ready``/``wait`` over the same buckets, through mpi4py's
    ``comm.Iallreduce`` (in place, SUM, then divided by the ranks: ``average=True``)."""

    def __init__(self, params: list, bucket_bytes: int, comm):
        import mpicoll
        layout = mpicoll.Buckets(params, bucket_bytes, comm=comm, gradient_as_bucket_view=True)
        self.grads, self.flat, self.comm = layout.grads, layout.flat, comm
        self.bucket_of = {i: k for k, members in enumerate(layout.buckets) for i in members}
        self.sizes = [len(members) for members in layout.buckets]
        self.missing, self.requests = list(self.sizes), []

    def ready(self, i: int) -> None:
        from mpi4py import MPI
        self.missing[self.bucket_of[i]] -= 1
        while len(self.requests) < len(self.flat) and self.missing[len(self.requests)] == 0:
            self.requests.append(self.comm.Iallreduce(MPI.IN_PLACE, self.flat[len(self.requests)],
                                                      MPI.SUM))

    def wait(self) -> None:
        from mpi4py import MPI
        MPI.Request.Waitall(self.requests)
        size = np.float32(self.comm.Get_size())
        for flat in self.flat:
            flat /= size
        self.missing, self.requests = list(self.sizes), []


def relative_difference(a: list, b: list) -> float:
    """max over parameters of |a - b| / |b| (Frobenius norms)."""
    return max(float(np.linalg.norm(x - y) / np.linalg.norm(y)) for x, y in zip(a, b))


def same_bits(comm, params: list) -> bool:
    """Whether every rank of ``comm`` holds these weights bit for bit."""
    mine = hashlib.sha256(b"".join(p.tobytes() for p in params)).digest()
    return len(set(comm.allgather(mine))) == 1


def drift(a: list, b: list) -> float:
    """|a - b| / |b| over all parameters together."""
    return float(np.sqrt(sum(np.sum((x - y) ** 2, dtype=np.float64) for x, y in zip(a, b)) /
                         sum(np.sum(y ** 2, dtype=np.float64) for y in b)))


def overlap_probe(comm, count: int = 1 << 20, repeats: int = 20) -> dict:
    """Medians over ``repeats`` (slowest rank) of: a blocking all-reduce of ``count`` fp32; a
    nogil numba loop alone; and the loop with an ``iallreduce`` in flight, then ``wait`` -- both
    in place, as ``Buckets`` run theirs (out of place on one node ``auto`` would run ``shm``, which
    a nonblocking call runs whole inside the progress thread: not what a bucket runs); and the
    progress thread's CPU time per ``iallreduce`` (``progress_cpu``: what the loop beside it may
    lose where no core is free)."""
    import mpicoll
    from mpi4py import MPI
    from numba import njit

    from mpicoll.executors import engine

    @njit(nogil=True, cache=False)
    def busy(x, rounds):
        for _ in range(rounds):
            for i in range(x.shape[0]):
                x[i] = 0.5 * x[i] + 1.0

    buf, x = np.ones(count, np.float32), np.zeros(1 << 16)
    busy(x, 1)
    mpicoll.allreduce(MPI.IN_PLACE, buf, comm=comm)
    mpicoll.iallreduce(MPI.IN_PLACE, buf, comm=comm).wait()
    t = time.perf_counter()
    busy(x, 50)
    rounds = max(1, int(50 * 0.01 / (time.perf_counter() - t)))    # about 10 ms of compute
    rounds = comm.allreduce(rounds, op=MPI.MIN)                     # the same loop everywhere

    def thread_cpu() -> float:
        t = engine._thread
        return time.clock_gettime(time.pthread_getcpuclockid(t.ident)) \
            if t is not None and t.is_alive() else 0.0

    def timed(fn):
        times = []
        for _ in range(repeats):
            comm.Barrier()
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        return max(comm.allgather(float(np.median(times))))

    def both():
        req = mpicoll.iallreduce(MPI.IN_PLACE, buf, comm=comm)
        busy(x, rounds)
        req.wait()

    cpu0 = thread_cpu()
    result = {"count": count,
              "comm": timed(lambda: mpicoll.allreduce(MPI.IN_PLACE, buf, comm=comm)),
              "compute": timed(lambda: busy(x, rounds)), "both": timed(both)}
    result["progress_cpu"] = max(comm.allgather((thread_cpu() - cpu0) / repeats))
    return result


# ----------------------------------------------------------------------------- elastic

def parse_kills(specs: list[str]) -> dict[int, set[int]]:
    """["2@37", "1@60"] -> {37: {2}, 60: {1}} (step -> world ranks that die at its start)."""
    kills: dict[int, set[int]] = {}
    for spec in specs:
        rank, at, step = spec.partition("@")
        if not (at and rank.isdigit() and step.isdigit()):
            raise SystemExit(f"train_dp.py: --kill {spec!r}: expected RANK@STEP, e.g. 2@37")
        kills.setdefault(int(step), set()).add(int(rank))
    return kills


def digest(params: list) -> str:
    return hashlib.sha256(b"".join(p.tobytes() for p in params)).hexdigest()


def train_elastic(*, steps: int, batch: int, micro: int, width: int, lr: float,
                  bucket_bytes: int, reproducible: bool, kills: dict, out: Path,
                  spares: int = 0, checkpoint: Path | None = None, every: int = 0,
                  resume: Path | None = None, seed: int = 0, data=None,
                  momentum: float = 0.0) -> dict:
    """Train under ``mpicoll.elastic.run`` on COMM_WORLD, committing after every step: a rank
    named in ``kills`` calls ``os._exit`` at the start of that step (writing the time to
    ``out/killed.rank<r>.json`` first), and the survivors go on from the last commit.

    Each step's global batch of ``batch`` samples is cut into micro-batches of ``micro``
    (``mpicoll.elastic.microbatches``). ``reproducible``: every rank computes each of its
    micro-batches' gradients (mean over the micro-batch), sums them with
    ``mpicoll.reproducible.sum`` and all-reduces that sum with ``reproducible=True``; divided by
    the number of micro-batches, that is the step's gradient, with the same bits at any rank
    count. Otherwise the rank's micro-batches make one local batch and ``Buckets`` (fp32,
    ``average=True``) average the gradients, rebuilt on the survivors' communicator by a reset
    callback. ``spares``: the last ranks wait as hot spares (``elastic.run``). ``checkpoint``:
    ``state.save`` there (asynchronous) after every ``every``-th step; ``resume``: start from
    the ``State.load`` of that directory (saved at any rank count). ``momentum``: SGD with
    momentum, its buffer sharded over the ranks (ZeRO-1: rank r keeps and applies block r of
    the flattened parameters, ``elastic.Shard``; the blocks are then broadcast by their owners),
    so a checkpoint saved at N is cut again at the resuming N. Returns this
    rank's {"params", "ranks_end", "recovered_at" (wall clock of the first step completed after
    each recovery), "commit_seconds" (per commit)}; on a spare that never trained, the CPU and
    wall seconds of its wait."""
    import mpicoll
    from mpi4py import MPI

    from mpicoll import elastic
    from mpicoll.schedule import block_displs

    world_rank = MPI.COMM_WORLD.Get_rank()
    X, y = make_data(seed) if data is None else data
    params = init_params(width, seed + 1)
    sizes = [p.size for p in params]
    offsets = np.cumsum([0] + sizes)
    flat = np.concatenate([p.reshape(-1) for p in params])          # the params: views of it
    params = [flat[offsets[i]:offsets[i + 1]].reshape(p.shape) for i, p in enumerate(params)]
    world = MPI.COMM_WORLD
    lo, hi = elastic.shard_bounds(flat.size, world.Get_size(), world.Get_rank())
    velocity = np.zeros(hi - lo, np.float32)                # this rank's block (momentum)
    order = np.random.default_rng(seed + 2).permutation(SAMPLES)
    start = 0
    if resume is not None:
        saved = elastic.State.load(resume, world)
        for i, p in enumerate(params):
            np.copyto(p, saved[f"p{i}"])
        if momentum:
            np.copyto(velocity, saved["velocity"])
        start = saved.step
    extra = {"velocity": elastic.Shard(velocity, flat.size)} if momentum else {}
    state = elastic.State(**{f"p{i}": p for i, p in enumerate(params)}, **extra, step=start)
    count = batch // micro                                  # micro-batches per step
    buckets: dict = {}
    recovered_at: list[float] = []
    commit_seconds: list[float] = []
    calls = []

    def rebuild(comm) -> None:
        """Reset callback: Buckets on the survivors' communicator."""
        buckets.clear()
        if not reproducible:
            buckets["b"] = mpicoll.Buckets(params, bucket_bytes, average=True, comm=comm,
                                           gradient_as_bucket_view=True)

    def train(state, comm):
        calls.append(comm.Get_size())
        if not buckets:
            rebuild(comm)
        share = count // comm.Get_size()
        stack = np.empty((share, offsets[-1]), np.float32)      # this rank's micro gradients
        views = [[row[offsets[i]:offsets[i + 1]].reshape(p.shape) for i, p in
                  enumerate(params)] for row in stack]
        first = True
        while state.step < steps:
            step = state.step
            if world_rank in kills.get(step, ()):
                (out / f"killed.rank{world_rank}.json").write_text(
                    json.dumps({"killed_at": time.time(), "step": step}))
                os._exit(1)
            samples = order[(step * batch + np.arange(batch)) % SAMPLES]
            mine = list(elastic.microbatches(samples, micro, comm))
            if reproducible:
                for grads, idx in zip(views, mine):
                    forward_backward(params, X[idx], y[idx], grads, lambda i: None)
                total = mpicoll.allreduce(mpicoll.reproducible.sum(stack, axis=0),
                                          reproducible=True, comm=comm)
                gradient = total / np.float32(count)
                grads = [gradient[offsets[i]:offsets[i + 1]].reshape(p.shape)
                         for i, p in enumerate(params)]
            else:
                b = buckets["b"]
                idx = np.concatenate(mine)
                forward_backward(params, X[idx], y[idx], b.grads, b.ready)
                b.wait()
                grads = b.grads
            if momentum:            # ZeRO-1: update my block, then every block from its owner
                g = np.concatenate([g.reshape(-1) for g in grads])[lo:hi]
                np.multiply(velocity, np.float32(momentum), out=velocity)
                np.add(velocity, g, out=velocity)
                flat[lo:hi] -= np.float32(lr) * velocity
                bounds = block_displs(flat.size, comm.Get_size())
                for r in range(comm.Get_size()):
                    mpicoll.bcast(flat[bounds[r]:bounds[r + 1]], r, comm=comm)
            else:
                for p, g in zip(params, grads):
                    p -= np.float32(lr) * g
            state.step = step + 1
            t = time.perf_counter()
            state.commit()
            commit_seconds.append(time.perf_counter() - t)
            if checkpoint is not None and state.step % every == 0:
                state.save(checkpoint, comm, asynchronous=True)
            if first and len(calls) > 1:
                recovered_at.append(time.time())
            first = False
        state.wait_saved()
        return comm

    state.register_reset_callbacks(rebuild)
    if spares:          # warm: a spare that joins computes at once (numba's kernels loaded)
        scratch = [np.empty_like(p) for p in params]
        forward_backward(params, X[:micro], y[:micro], scratch, lambda i: None)
        mpicoll.reproducible.warmup()
    cpu, wall = time.process_time(), time.perf_counter()
    comm = elastic.run(train, state, MPI.COMM_WORLD, spares=spares)
    if comm is None:    # a spare the training did not need: what its wait cost
        return {"spare_cpu_seconds": time.process_time() - cpu,
                "spare_wall_seconds": time.perf_counter() - wall}
    return {"params": params, "comm": comm, "ranks_end": comm.Get_size(),
            "recovered_at": recovered_at, "commit_seconds": commit_seconds,
            "final_loss": loss_of(params, X[:EVAL], y[:EVAL])}


def elastic_main(args, data) -> None:
    """--elastic, --kill, --reproducible: one configuration (bucketed, or reproducible sums) under
    ``mpicoll.elastic.run``; every survivor writes DIR/train_dp_elastic.rank<r>.json, the
    lowest surviving rank DIR/train_dp_elastic.json and prints ``weights sha256 <hex>``."""
    from mpi4py import MPI

    world = MPI.COMM_WORLD
    out = outdir_of(args)
    kills = parse_kills(args.kill)
    (out / f"killed.rank{world.Get_rank()}.json").unlink(missing_ok=True)   # a past run's
    for rank in set().union(*kills.values()):
        if rank >= world.Get_size():
            raise SystemExit(f"train_dp.py: --kill {rank}@...: there are {world.Get_size()} "
                             f"ranks")
    batch = args.batch or 24 * args.micro
    start = time.time()
    r = train_elastic(steps=args.steps, batch=batch, micro=args.micro, width=args.width,
                      lr=args.lr, bucket_bytes=args.bucket_kib << 10,
                      reproducible=args.reproducible, kills=kills, out=out,
                      spares=args.spares, checkpoint=args.checkpoint,
                      every=args.checkpoint_every, resume=args.resume, data=data,
                      momentum=args.momentum)
    died = any(out.glob("killed.rank*.json"))
    if "spare_cpu_seconds" in r:            # a spare the training did not need
        (out / f"train_dp_elastic.rank{world.Get_rank()}.json").write_text(
            json.dumps({"world_rank": world.Get_rank(), "spare": True, **r}) + "\n")
        if died:
            os._exit(0)                     # MPI_Finalize would wait for the dead ranks
        return
    killed = sorted((json.loads(p.read_text())["killed_at"], p.name)
                    for p in out.glob("killed.rank*.json"))
    # the time from each death to the first step completed on the survivors' communicator
    recovery = [round(at - max((k for k, _ in killed if k < at), default=start), 3)
                for at in r["recovered_at"]]
    commits = np.array(r["commit_seconds"])
    row = {"world_rank": world.Get_rank(), "ranks_start": world.Get_size() - args.spares,
           "spares": args.spares,
           "ranks_end": r["ranks_end"], "reproducible": args.reproducible, "batch": batch,
           "micro": args.micro, "steps": args.steps, "kill": args.kill,
           "weights_sha256": digest(r["params"]), "final_loss": r["final_loss"],
           "recovery_seconds": recovery,
           "commit_ms_median": 1e3 * float(np.median(commits)) if commits.size else None,
           "state_bytes": int(sum(p.nbytes for p in r["params"]))}
    (out / f"train_dp_elastic.rank{world.Get_rank()}.json").write_text(json.dumps(row) + "\n")
    if r["comm"].Get_rank() == 0:
        (out / "train_dp_elastic.json").write_text(json.dumps(row, indent=1) + "\n")
        np.savez(out / "weights.npz", *r["params"])
        print(f"# {world.Get_size() - args.spares} -> {r['ranks_end']} ranks "
              f"({args.spares} spares), final loss "
              f"{r['final_loss']:.4f}, recovery seconds {recovery}, commit "
              f"{row['commit_ms_median']:.3f} ms (median) for {row['state_bytes']} bytes",
              flush=True)
        print(f"weights sha256 {row['weights_sha256']}", flush=True)
    if died or r["recovered_at"]:   # (a rank found dead, killed here or not: it may live on)
        os._exit(0)         # MPI_Finalize would wait for the dead ranks (docs/elastic.md)


def outdir_of(args) -> Path:
    args.outdir.mkdir(parents=True, exist_ok=True)
    return args.outdir


# ----------------------------------------------------------------------------- the job

CONFIGS = [("blocking", None, False), ("bucketed", None, False),
           ("mpi4py Iallreduce", None, False), ("bucketed", "bf16", False),
           ("bucketed", "fp16", False), ("bucketed", "int8", True), ("bucketed", "int8", False)]


def table(rows: list[dict]) -> str:
    """The markdown table of the rows (docs/training.md quotes it: ``--table JSON``)."""
    out = ["| mode | wire format | step ms | compute ms | exposed comm ms | rest ms | "
           "wire KiB/step/rank | final loss | weights vs 1 process |",
           "|---|---|---|---|---|---|---|---|---|"]
    def wire(w):        # (mpicoll counts its own bytes; MPI's Iallreduce moves them unseen)
        return "(MPI's)" if w["mode"] == "mpi4py Iallreduce" else \
            f"{w['wire_bytes_per_step'] / 1024:.1f}"
    out += [f"| {w['mode']} | {w['compress']} | {w['step_ms']:.2f} | {w['compute_ms']:.2f} | "
            f"{w['comm_ms']:.2f} | {w['rest_ms']:.2f} | {wire(w)} | "
            f"{w['final_loss']:.4f} | {w['drift']:.1e} |" for w in rows]
    return "\n".join(out) + "\n"


def main() -> None:
    import sys
    if sys.argv[1:2] == ["--table"]:            # the table of a recorded run; no MPI
        import json
        print(table(json.loads(Path(sys.argv[2]).read_text())["rows"]), end="")
        return
    from _util import outdir, parser, say, write_json
    from mpi4py import MPI

    from mpicoll.executors import progress

    ap = parser(__doc__)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--batch", type=int, default=None,
                    help="global batch, samples (default 512; with --elastic, --kill or "
                         "--reproducible 24 micro-batches: 2, 3 and 4 ranks divide it)")
    ap.add_argument("--width", type=int, default=512)
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--bucket-kib", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=1,
                    help="run every configuration this many times, interleaved; report the "
                         "run with the median mean step time")
    ap.add_argument("--kill", action="append", default=[], metavar="RANK@STEP",
                    help="that rank calls os._exit at the start of that step; repeatable. "
                         "Runs under mpicoll.elastic.run (launch every rank under "
                         "`mpiexec -disable-auto-cleanup ... python -m mpicoll survive`)")
    ap.add_argument("--reproducible", action="store_true",
                    help="sum micro-batch gradients with mpicoll.reproducible.sum and "
                         "all-reduce them with reproducible=True: the same bits at any N")
    ap.add_argument("--micro", type=int, default=16, help="samples per micro-batch (16)")
    ap.add_argument("--spares", type=int, default=0, metavar="S",
                    help="the last S ranks wait as hot spares; one joins when a rank dies")
    ap.add_argument("--checkpoint", type=Path, default=None, metavar="DIR",
                    help="State.save to DIR (asynchronous) every --checkpoint-every steps")
    ap.add_argument("--checkpoint-every", type=int, default=25, metavar="K")
    ap.add_argument("--resume", type=Path, default=None, metavar="DIR",
                    help="start from State.load(DIR), saved at any rank count")
    ap.add_argument("--momentum", type=float, default=0.0, metavar="BETA",
                    help="SGD momentum, its buffer sharded over the ranks (ZeRO-1; "
                         "checkpoints re-shard it; a death can't be recovered in memory)")
    ap.add_argument("--elastic", action="store_true",
                    help="run under mpicoll.elastic.run (as --kill and --reproducible do): "
                         "one configuration, bucketed, the weights' sha256")
    args = ap.parse_args()
    if args.momentum and (args.kill or args.spares):
        raise SystemExit("train_dp.py: --momentum (a sharded state) with --kill or --spares: "
                         "a dead rank's block can't be restored in memory")
    if args.elastic or args.kill or args.reproducible or args.spares or args.checkpoint or \
            args.resume or args.momentum:
        return elastic_main(args, make_data(0))
    args.batch = args.batch or 512
    comm = MPI.COMM_WORLD
    size = comm.Get_size()
    data = make_data(0)
    common = dict(steps=args.steps, batch=args.batch, width=args.width, lr=args.lr,
                  bucket_bytes=args.bucket_kib << 10, data=data)
    say(f"# train_dp: {size} ranks, batch {args.batch} ({args.batch // size} per rank), "
        f"width {args.width}, {args.steps} steps, lr {args.lr}, buckets of {args.bucket_kib} KiB; "
        f"MPI thread level {MPI.Query_thread()} (MULTIPLE = {MPI.THREAD_MULTIPLE}), "
        f"progress: {progress.mode()}")
    single = train(None, **common)
    say(f"# one process on the whole batch: final loss {single['final_loss']:.4f}")
    train(comm, **{**common, "steps": 5})                   # warm-up: compile, first calls
    for c in CONFIGS[1:]:
        train(comm, **{**common, "steps": 2}, mode=c[0], compress=c[1], error_feedback=c[2])
    runs = {c: [] for c in CONFIGS}
    for _ in range(args.repeats):
        for c in CONFIGS:
            comm.Barrier()
            runs[c].append(train(comm, **common, mode=c[0], compress=c[1], error_feedback=c[2]))
    rows = []
    for (mode, compress, ef), results in runs.items():
        # per rank the mean over steps of (total, compute, comm); then the slowest rank's
        stats = [max(comm.allgather(r["times"].mean(axis=0)), key=lambda t: t[0])
                 for r in results]
        k = int(np.argsort([s[0] for s in stats])[len(stats) // 2])
        r, (total, compute, exposed) = results[k], stats[k]
        name = compress or "fp32"
        if compress == "int8":
            name += " + EF" if ef else " no EF"
        rows.append({"mode": mode, "compress": name, "step_ms": 1e3 * total,
                     "compute_ms": 1e3 * compute, "comm_ms": 1e3 * exposed,
                     "rest_ms": 1e3 * (total - compute - exposed),
                     "wire_bytes_per_step": r["bytes_sent"] / args.steps,
                     "final_loss": r["final_loss"],
                     "drift": drift(r["params"], single["params"]),
                     "max_param_difference": relative_difference(r["params"], single["params"]),
                     "same_bits": same_bits(comm, r["params"])})
    probe = overlap_probe(comm)
    hidden = (probe["comm"] + probe["compute"] - probe["both"]) / probe["comm"]
    say(f"\noverlap probe, all-reduce of {probe['count'] * 4 >> 20} MiB fp32: blocking "
        f"{1e3 * probe['comm']:.2f} ms, numba compute alone {1e3 * probe['compute']:.2f} ms, "
        f"compute with the iallreduce in flight then wait {1e3 * probe['both']:.2f} ms "
        f"(sum of the two: {1e3 * (probe['comm'] + probe['compute']):.2f} ms; "
        f"{100 * hidden:.0f} % of the communication hidden; the progress thread's CPU "
        f"{1e3 * probe['progress_cpu']:.2f} ms per iallreduce)")
    say("\n" + table(rows).rstrip("\n"))
    say(f"\none process on batch {args.batch}: final loss {single['final_loss']:.4f}")
    if comm.Get_rank() == 0:
        write_json(outdir(args.outdir) / "train_dp.json",
                   {"args": {k: str(v) for k, v in vars(args).items()}, "ranks": size,
                    "single_final_loss": single["final_loss"],
                    "single_moved": relative_difference(init_params(args.width, 1),
                                                        single["params"]),
                    "rows": rows,
                    "overlap_probe": probe})


if __name__ == "__main__":
    main()
