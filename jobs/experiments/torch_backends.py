"""PyTorch's ``dist.all_reduce`` on the "mpicoll" backend against "gloo" and ``MPI_Allreduce``,
and DDP's step time on each.

    mpiexec -n 4 python -m mpi4py jobs/experiments/torch_backends.py [-b 8 -e 64M -f 8] [--repeats 3]
        [--algorithms auto,ring,...] [--ddp-steps 50] [--outdir DIR]

One job, every rank: ``init_process_group("mpicoll")`` (ranks from MPI, no MASTER_ADDR), one
``new_group(backend="mpicoll", pg_options=Options(algorithm=a))`` per algorithm, a Gloo group
(``new_group(backend="gloo")``, over the TCPStore ``mpicoll.torch`` set up on 127.0.0.1) and
mpi4py's ``MPI_Allreduce`` on a ``Dup`` of COMM_WORLD. For each size (float32 tensors, ``-b``
to ``-e`` by factors of ``-f``) the contenders take turns, round-robin, ``--repeats`` rounds of
``iters`` calls each (more at small sizes), on the same tensor; the median time per call over
the rounds gives bus bandwidth ``2 (N-1)/N * bytes / time`` (nccl-tests' all-reduce busbw).
Blocking calls (``async_op=False``), as a training loop's ``dist.all_reduce(loss)`` would.

Then the DDP trainer (``mpicoll.testing.ddp_train``: a seeded MLP, 32 -> 64 -> 64 -> 10, SGD,
50 steps; the same one tests/torch checks against Gloo) on the default mpicoll group, on Gloo,
and with ``mpicoll.torch.compress_hook("bf16")``: the median step time and the weights'
relative distance from Gloo's.

Writes DIR/torch_backends-np<N>.json (default results/) and, with matplotlib,
DIR/torch_backends-np<N>.png. ``python jobs/experiments/torch_backends.py --table A.json [B.json ...]``
prints the markdown tables of docs/torch.md from such files (no MPI).
"""

from __future__ import annotations

import os
import time

for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")        # one BLAS thread per rank: the ranks share cores

import numpy as np                          # noqa: E402


def relative(a, b) -> float:
    """max |a - b| / max |b|."""
    return float((a - b).abs().max() / b.abs().max())


# ----------------------------------------------------------------------------- the sweep

def sizes(begin: int, end: int, factor: int) -> list:
    """begin, begin * factor, ... up to end, and end itself."""
    out, n = [], begin
    while n < end:
        out.append(n)
        n *= factor
    return out + [end]


def iterations(nbytes: int) -> int:
    """Calls per round: enough that one round is not dominated by the timer at small sizes,
    few at large ones (the machine is shared)."""
    return max(2, min(50, (1 << 22) // max(nbytes, 1)))


def parse_size(text: str) -> int:
    text = text.strip().upper()
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
    return int(float(text.rstrip("KMG") if mult > 1 else text) * mult)


def table(paths) -> str:
    """docs/torch.md's tables: time and busbw per size, and DDP's step time, per JSON file."""
    import json
    out = []
    for path in paths:
        data = json.loads(open(path).read())
        names = data["contenders"]
        out.append(f"**N = {data['ranks']}** (torch {data['torch']}, median of "
                   f"{data['repeats']} interleaved rounds; load average "
                   f"{data['load_average']:.1f} on 2 cores at the end): bus bandwidth in MB/s "
                   f"(2 (N-1)/N bytes / time; the time per call is in the JSON); auto/gloo = "
                   f"Gloo's time / mpicoll auto's (> 1: mpicoll faster)\n")
        short = [n.replace("mpicoll ", "") for n in names]
        out.append("| bytes | " + " | ".join(short) + " | auto/gloo | best mpicoll / gloo |")
        out.append("|---:|" + "---:|" * (len(names) + 2))
        for row in data["rows"]:
            ours = [n for n in names if n.startswith("mpicoll")]
            best = min(ours, key=lambda n: row[n]["time_us"])
            cells = [f"{row[n]['busbw_GBps'] * 1e3:.3g}" for n in names]
            out.append(f"| {row['bytes']} | " + " | ".join(cells) +
                       f" | {row['gloo']['time_us'] / row['mpicoll auto']['time_us']:.2f} | "
                       f"{row['gloo']['time_us'] / row[best]['time_us']:.2f} "
                       f"({best.replace('mpicoll ', '')}) |")
        if data.get("ddp"):
            out.append("\n| DDP trainer | ms/step (median, slowest rank) | weights vs Gloo (max rel.) |")
            out.append("|---|---:|---:|")
            for name, d in data["ddp"].items():
                out.append(f"| {name} | {d['step_ms']:.2f} | {d['rel_diff_vs_gloo']:.1e} |")
        out.append("")
    return "\n".join(out)


def main() -> None:
    import argparse
    import sys
    if len(sys.argv) > 2 and sys.argv[1] == "--table":
        print(table(sys.argv[2:]))
        return
    from datetime import timedelta

    import torch
    import torch.distributed as dist
    from mpi4py import MPI

    import mpicoll
    import mpicoll.torch
    from mpicoll.testing import ddp_train

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-b", default="8", help="smallest message in bytes (default 8)")
    ap.add_argument("-e", default="64M", help="largest message in bytes (default 64M)")
    ap.add_argument("-f", type=int, default=8, help="size factor (default 8)")
    ap.add_argument("--repeats", type=int, default=3, help="rounds per size (default 3)")
    ap.add_argument("--algorithms", default=",".join(("auto",) + tuple(
        a for a in mpicoll.ALGORITHMS if a not in ("mpi", "naive"))),
        help="mpicoll all-reduce algorithms to run (default: auto and each but naive, mpi)")
    ap.add_argument("--ddp-steps", type=int, default=50, help="DDP trainer steps (0: skip)")
    ap.add_argument("--outdir", default="results", help="output directory (default results/)")
    args = ap.parse_args()

    torch.set_num_threads(1)
    world = MPI.COMM_WORLD
    rank, size = world.Get_rank(), world.Get_size()
    dist.init_process_group("mpicoll", timeout=timedelta(minutes=10))
    groups = {}
    for a in args.algorithms.split(","):
        groups[f"mpicoll {a}"] = dist.new_group(backend="mpicoll",
                                                pg_options=mpicoll.torch.Options(algorithm=a))
    groups["gloo"] = dist.new_group(backend="gloo")
    mpi_comm = world.Dup()
    contenders = list(groups) + ["MPI_Allreduce"]

    def say(*a):
        if rank == 0:
            print(*a, flush=True)

    say(f"# torch {torch.__version__}, {size} ranks, {MPI.Get_library_version().splitlines()[0]}")
    say(f"# load average at start: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    rows = []
    for nbytes in sizes(parse_size(args.b), parse_size(args.e), args.f):
        count = max(1, nbytes // 4)
        x = torch.ones(count, dtype=torch.float32)
        view = x.numpy()
        iters = iterations(nbytes)
        samples = {c: [] for c in contenders}
        for name in contenders:                 # warm-up: plans, numba, connections
            run_one(name, groups, mpi_comm, x, view)
        for _ in range(args.repeats):
            for name in contenders:
                world.Barrier()
                started = time.perf_counter()
                for _ in range(iters):
                    run_one(name, groups, mpi_comm, x, view)
                elapsed = (time.perf_counter() - started) / iters
                samples[name].append(world.allreduce(elapsed, op=MPI.MAX))
        x.fill_(1.0)
        dist.all_reduce(x, group=groups["gloo"])
        assert float(x[0]) == size, "gloo gave a wrong sum"
        row = {"bytes": count * 4, "iters": iters}
        for name in contenders:
            t = float(np.median(samples[name]))
            row[name] = {"time_us": t * 1e6,
                         "busbw_GBps": 2 * (size - 1) / size * count * 4 / t / 1e9}
        rows.append(row)
        best = max((c for c in contenders if c.startswith("mpicoll")),
                   key=lambda c: row[c]["busbw_GBps"])
        say(f"{count * 4:>10} B  " + "  ".join(
            f"{c}: {row[c]['time_us']:9.1f} us" for c in contenders)
            + f"  | auto/gloo {row['gloo']['time_us'] / row['mpicoll auto']['time_us']:.2f}x"
            f"  best {best}")

    ddp = {}
    if args.ddp_steps:
        runs = {"mpicoll auto": dict(group=None), "gloo": dict(group=groups["gloo"]),
                "mpicoll bf16 hook": dict(group=None,
                                          hook=mpicoll.torch.compress_hook("bf16"))}
        weights = {}
        for _ in range(2):                      # interleaved, twice: the second is reported
            for name, kw in runs.items():
                world.Barrier()
                w, times = ddp_train(steps=args.ddp_steps, **kw)
                weights[name] = w
                step = world.allreduce(float(np.median(times[5:])), op=MPI.MAX)
                ddp[name] = {"step_ms": step * 1e3}
        for name in runs:
            ddp[name]["rel_diff_vs_gloo"] = relative(weights[name], weights["gloo"])
            say(f"DDP {name}: {ddp[name]['step_ms']:.2f} ms/step, weights vs gloo "
                f"{ddp[name]['rel_diff_vs_gloo']:.2e}")
    say(f"# load average at end: {os.getloadavg()[0]:.1f}")

    if rank == 0:
        import json
        from pathlib import Path
        out = Path(args.outdir)
        out.mkdir(parents=True, exist_ok=True)
        data = {"ranks": size, "torch": torch.__version__, "repeats": args.repeats,
                "contenders": contenders, "rows": rows, "ddp": ddp,
                "load_average": os.getloadavg()[0]}
        (out / f"torch_backends-np{size}.json").write_text(json.dumps(data, indent=1) + "\n")
        try:
            plot(data, out / f"torch_backends-np{size}.png")
        except ImportError:
            pass
    dist.destroy_process_group()


def run_one(name: str, groups: dict, mpi_comm, x, view) -> None:
    import torch.distributed as dist
    from mpi4py import MPI
    if name == "MPI_Allreduce":
        mpi_comm.Allreduce(MPI.IN_PLACE, view, op=MPI.SUM)
    else:
        dist.all_reduce(x, group=groups[name])


def plot(data: dict, path) -> None:
    """Bus bandwidth against size, one line per contender."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(8, 5))
    xs = [r["bytes"] for r in data["rows"]]
    for name in data["contenders"]:
        style = "-o" if name in ("gloo", "MPI_Allreduce", "mpicoll auto") else ":."
        ax.plot(xs, [r[name]["busbw_GBps"] for r in data["rows"]], style, label=name)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("bytes per rank (float32)")
    ax.set_ylabel("bus bandwidth, GB/s (median of rounds)")
    ax.set_title(f"dist.all_reduce, {data['ranks']} ranks, torch {data['torch']}")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
