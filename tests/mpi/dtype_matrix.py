"""Every dtype x op MPI allows, for every all-reduce algorithm and both executors, checked.

    mpiexec -n 4 python -m mpi4py tests/mpi/dtype_matrix.py [--counts 0,1,5,1001] [--executors ...]
                                                       [--algorithms ...] [--dtypes ...]

For each dtype of ``mpicoll.kernels.DTYPES`` and each op MPI allows on it (``kernels.RULES``),
every all-reduce algorithm (``mpi`` too, where the MPI library has the type) runs on inputs
that every rank can rebuild for every other rank, under each executor (``MPICOLL_EXECUTOR``:
``compiled``, ``python``), out of place and in place. It checks:

* integers and bools: the result equals numpy's reduction of all ranks' inputs (exact, in any
  order: integer sums and products wrap, logical and bitwise ops are order-free);
* floats and complex (random values salted with NaNs, infinities, -0.0 and subnormals): the
  result is bitwise the in-process executor's (``mpicoll.simulators.inprocess``) for the same algorithm; for
  ``mpi``, which has no schedule, small integers as floats whose result is exact;
* every rank ends with the same bits;
* every pair MPI does not allow raises TypeError on every rank, naming the dtype, the op and
  the ops the dtype allows, before any communication; bfloat16 with ``algorithm="mpi"`` raises
  TypeError naming mpicoll's own algorithms.

Rank 0 prints one line per dtype and a total; the exit status is 1 if anything was wrong.
"""

from __future__ import annotations

import argparse
import sys
import time
import zlib

import numpy as np
from mpi4py import MPI

import mpicoll
from mpicoll import kernels
from mpicoll.simulators import inprocess
from mpicoll.algorithms import allreduce_shm
from mpicoll.registry import ALLREDUCE
from mpicoll.testing import environment, exact_input, exact_result, nodes as node_layout

BF16 = kernels.bfloat16


def float_input(rank: int, n: int, dtype: np.dtype, seed: int) -> np.ndarray:
    """Random values of ``dtype`` salted with special ones; the same for a rank on every rank."""
    if dtype.kind == "c":
        part = np.dtype(f"f{dtype.itemsize // 2}")
        x = np.empty(n, dtype)
        x.real, x.imag = float_input(rank, n, part, seed), float_input(rank, n, part, seed + 1)
        return x
    rng = np.random.default_rng([seed, rank, n, kernels.DTYPES.index(dtype)])
    scale = 1e3 if dtype.itemsize == 2 else 1e30
    x = (rng.standard_normal(n) * rng.choice([1e-3, 1.0, scale], n)).astype(dtype)
    info = np.finfo(np.float32) if dtype == BF16 else np.finfo(dtype)
    tiny = float(np.array(1, np.uint16).view(BF16)) if dtype == BF16 else \
        float(info.smallest_subnormal)
    special = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, tiny, -tiny], np.float64)
    pick = rng.integers(0, 12, n)
    with np.errstate(over="ignore"):
        x[pick < len(special)] = special[pick[pick < len(special)]].astype(dtype)
    bits = x.view(np.dtype(f"u{dtype.itemsize}"))
    bits[np.isnan(x)] |= rank + 1              # each rank's NaNs carry their own payload
    return x


def int_input(rank: int, n: int, dtype: np.dtype, seed: int) -> np.ndarray:
    """Full-range random integers (sums and products wrap), or random bools."""
    rng = np.random.default_rng([seed, rank, n, kernels.DTYPES.index(dtype)])
    if dtype.kind == "b":
        return rng.integers(0, 2, n).astype(bool)
    info = np.iinfo(dtype)
    x = rng.integers(info.min, info.max, n, dtype=dtype, endpoint=True)
    x[rng.integers(0, 4, n) == 0] = 0           # zeros, for the logical ops
    return x


def numpy_reduction(inputs: list, op: str, dtype: np.dtype) -> np.ndarray:
    acc = inputs[0].copy()
    reduce_into = kernels.numpy_kernel(op, dtype)
    with np.errstate(all="ignore"):
        for x in inputs[1:]:
            reduce_into(kernels.as_storage(acc), kernels.as_storage(x))
    return acc


def same_everywhere(comm, *arrays) -> bool:
    crc = zlib.crc32(b"".join(a.tobytes() for a in arrays))
    return comm.allreduce(crc, op=MPI.MAX) == comm.allreduce(crc, op=MPI.MIN)


def check_pair(comm, dtype, op, algorithm, counts, seed, nodes) -> list:
    """Problems with ``op`` on ``dtype`` under ``algorithm`` (this rank's view)."""
    problems, size, rank = [], comm.Get_size(), comm.Get_rank()
    algo = ALLREDUCE[algorithm]
    exact = dtype.kind in "iub"
    for n in counts:
        if algo.library and not exact:          # no schedule to simulate: exact floats
            inputs = [exact_input(r, n, dtype, op) for r in range(size)]
            want = exact_result(size, n, dtype, op)
        elif exact:
            inputs = [int_input(r, n, dtype, seed) for r in range(size)]
            want = numpy_reduction(inputs, op, dtype)
        elif algo.has("shared-memory"):         # shm's documented bits: rank order, left to right
            inputs = [float_input(r, n, dtype, seed) for r in range(size)]
            want = numpy_reduction(inputs, op, dtype)
        else:
            inputs = [float_input(r, n, dtype, seed) for r in range(size)]
            options = {"nodes": nodes} if algo.has("node-layout") else {}
            want = inprocess.allreduce(inputs, op, algorithm, **options)[rank]
        x = inputs[rank]
        keep = x.copy()
        out = mpicoll.allreduce(x, op=op, algorithm=algorithm, comm=comm)
        inplace = x.copy()
        mpicoll.allreduce(MPI.IN_PLACE, inplace, op=op, algorithm=algorithm, comm=comm)
        label = f"{dtype} {op} {algorithm} n={n}"
        if out.dtype != dtype:
            problems.append(f"{label}: result dtype {out.dtype}")
        # the MPI library's own complex product may sign a zero imaginary part otherwise than
        # numpy's fused multiply-add (MPICH at N = 8: 1+0j against 1-0j): equal in value
        library_complex_prod = algo.library and dtype.kind == "c" and op == "prod"
        if out.tobytes() != want.tobytes() and not (library_complex_prod
                                                    and np.array_equal(out, want)):
            bad = np.flatnonzero((out.view(np.uint8) != want.view(np.uint8)).reshape(n, -1)
                                 .any(axis=1)) if n else []
            problems.append(f"{label}: {len(bad)} element(s) differ from the "
                            f"{'exact answer' if exact or algo.library else 'reference bits'}"
                            f" (first at {bad[0] if len(bad) else '?'})")
        if inplace.tobytes() != out.tobytes():
            problems.append(f"{label}: in place differs from out of place")
        if x.tobytes() != keep.tobytes():
            problems.append(f"{label}: sendbuf was modified")
        if not same_everywhere(comm, out, inplace):
            problems.append(f"{label}: ranks ended with different bits")
    return problems


def check_refusals(comm, algorithms) -> list:
    """Every pair MPI does not allow, and bfloat16 with the library, raise TypeError here."""
    problems = []
    for dtype in kernels.DTYPES:
        for op in kernels.OPS:
            if kernels.allowed(op, dtype):
                continue
            for algorithm in algorithms:
                try:
                    mpicoll.allreduce(np.zeros(3, dtype), op=op, algorithm=algorithm, comm=comm)
                    problems.append(f"{dtype} {op} {algorithm}: no error")
                except TypeError as e:
                    text = str(e)
                    if str(dtype) not in text or repr(op) not in text or \
                            ", ".join(kernels.ops_for(dtype)) not in text:
                        problems.append(f"{dtype} {op} {algorithm}: unclear error {text!r}")
    for op in kernels.ops_for(BF16):
        try:
            mpicoll.allreduce(np.zeros(3, BF16), op=op, algorithm="mpi", comm=comm)
            problems.append(f"bfloat16 {op} mpi: no error")
        except TypeError as e:
            if "'ring'" not in str(e) or "bfloat16" not in str(e):
                problems.append(f"bfloat16 {op} mpi: unclear error {e}")
    return problems


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--counts", default="0,1,5,1001",
                    help="comma list of element counts (default 0,1,5,1001)")
    ap.add_argument("--executors", default="compiled,python")
    ap.add_argument("--algorithms", default=",".join(mpicoll.ALGORITHMS))
    ap.add_argument("--dtypes", default=",".join(str(d) for d in kernels.DTYPES))
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args(argv)
    comm = MPI.COMM_WORLD.Dup()
    rank, size = comm.Get_rank(), comm.Get_size()
    counts = [int(c) for c in args.counts.split(",")]
    algorithms = args.algorithms.split(",")
    nodes = node_layout(comm) if size > 1 else ((0,),)
    started, checked, total = time.monotonic(), 0, []
    if rank == 0:
        print(f"# dtype_matrix: N={size}, counts {counts}, executors {args.executors}, "
              f"{len(algorithms)} algorithms, {MPI.Get_library_version().splitlines()[0]}")
    for executor in args.executors.split(","):
        with environment(MPICOLL_EXECUTOR=executor):
            for dtype in [d for d in kernels.DTYPES if str(d) in args.dtypes.split(",")]:
                problems, pairs = [], 0
                for op in kernels.ops_for(dtype):
                    for algorithm in algorithms:
                        if ALLREDUCE[algorithm].library and not mpicoll.ops.library_has(dtype):
                            continue
                        if (ALLREDUCE[algorithm].has("shared-memory")
                                and not allreduce_shm.supports(op, dtype)):
                            continue        # refused by shm's own check (tests/mpi/test_shm.py)
                        problems += check_pair(comm, dtype, op, algorithm, counts, args.seed,
                                               nodes)
                        pairs += 1
                everyone = comm.gather(problems, root=0)
                checked += pairs
                if rank == 0:
                    flat = [f"rank {r}: {p}" for r, ps in enumerate(everyone) for p in ps]
                    total += flat
                    print(f"{executor:<9} {str(dtype):<10} {' '.join(kernels.ops_for(dtype)):<40}"
                          f" {pairs:>4} (op, algorithm) pairs: "
                          f"{'ok' if not flat else f'{len(flat)} PROBLEMS'}", flush=True)
                    for line in flat[:10]:
                        print(f"    {line}", flush=True)
    refusals = comm.gather(check_refusals(comm, algorithms), root=0)
    if rank == 0:
        flat = [f"rank {r}: {p}" for r, ps in enumerate(refusals) for p in ps]
        total += flat
        print(f"refusals: every pair MPI does not allow, and bfloat16 with mpi: "
              f"{'ok' if not flat else f'{len(flat)} PROBLEMS'}")
        for line in flat[:10]:
            print(f"    {line}")
        print(f"# N={size}: {checked} (executor, dtype, op, algorithm) combinations x "
              f"{len(counts)} counts x 2 placements, {len(total)} problems, "
              f"{time.monotonic() - started:.0f} s")
    bad = comm.bcast(len(total) if rank == 0 else None, root=0)
    comm.Free()
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
