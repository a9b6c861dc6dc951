"""DDP's training step on the "mpicoll" process group against "gloo", in one job (issue 43).

    mpiexec -n 2 python -m mpi4py jobs/experiments/ddp_bench.py [--models mlp-0.2M,mlp-2M,...]
        [--steps 20] [--batch 32] [--outdir docs/results]

Models (``--models``; seeded, the same on every rank and backend): MLPs of about 0.2 M, 2 M,
10 M and 50 M parameters (mlp-50M: 200 MB of gradients, 25 s of a 5-step run at N = 2) and one
transformer encoder layer from ``torch.nn`` (d_model 256, 4 heads, 1024 wide; sequences of 32).
Each model is wrapped twice, ``DistributedDataParallel(model, process_group=g)`` for g =
mpicoll's default group and a Gloo group (DDP's default bucket cap, 25 MB), a third copy
runs under ``no_sync()`` (no all-reduce: the *compute* of a step), and a fourth on mpicoll with
``mpicoll.torch.compress_hook("bf16")`` (bf16 on the wire). The four take turns step by
step (SGD, batch ``--batch`` per rank, each rank its own data), ``--steps`` timed steps each
after 3 warm-up steps. Per step: its wall time, the exposed communication (step time - the
median no-sync step time), the main thread's CPU time, and the CPU seconds of each of
mpicoll's threads (``mpicoll-progress``, ``mpicoll-torch-completer``, ``mpicoll-detector``)
during the step. The JSON has each rank's medians; the table shows the slowest rank's.

Writes DIR/ddp-np<N>.json and, with matplotlib, DIR/ddp-np<N>.png;
``python jobs/experiments/ddp_bench.py --table A.json [B.json ...]`` prints docs/torch.md's
table, ``--plot A.json A.png`` draws the plot (no MPI).
"""

from __future__ import annotations

import json
import os
import sys
import time

for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")        # one BLAS thread per rank: the ranks share cores

import numpy as np                          # noqa: E402

MODELS = {   # name: (layer widths of an MLP, or None for the transformer layer)
    "mlp-0.2M": (256, 512, 128, 10),
    "mlp-2M": (512, 1024, 1024, 512, 10),
    "mlp-10M": (1024, 2048, 2048, 2048, 512, 10),
    "mlp-50M": (2048, 4096, 4096, 4096, 2048, 10),
    "transformer": None,
}
KINDS = ("mpicoll", "gloo", "compute", "bf16")     # compute: the mpicoll model under no_sync();
#                                                     bf16: mpicoll with compress_hook("bf16")


def build(name: str, seed: int = 0):
    """(model, make_batch(gen) -> (x, y), loss(out, y))."""
    import torch
    import torch.nn.functional as F
    torch.manual_seed(seed)
    widths = MODELS[name]
    if widths is None:
        d, seq = 256, 32
        model = torch.nn.TransformerEncoderLayer(d, 4, 1024, dropout=0.0, batch_first=True)
        return (model, lambda gen, b: (torch.randn(b, seq, d, generator=gen),
                                       torch.randn(b, seq, d, generator=gen)),
                F.mse_loss)
    layers = []
    for a, b in zip(widths, widths[1:]):
        layers += [torch.nn.Linear(a, b), torch.nn.ReLU()]
    model = torch.nn.Sequential(*layers[:-1])
    return (model, lambda gen, b: (torch.randn(b, widths[0], generator=gen),
                                   torch.randint(0, widths[-1], (b,), generator=gen)),
            F.cross_entropy)


def bench(name: str, groups: dict, steps: int, batch: int, rank: int) -> dict:
    import torch
    from torch.nn.parallel import DistributedDataParallel as DDP

    import mpicoll.torch
    from wait_cost import thread_cpu
    runs, gen = {}, torch.Generator().manual_seed(1000 + rank)
    for kind in KINDS:
        model, make_batch, loss_fn = build(name)
        ddp = DDP(model, process_group=groups["gloo" if kind == "gloo" else "mpicoll"])
        if kind == "bf16":
            ddp.register_comm_hook(None, mpicoll.torch.compress_hook("bf16"))
        runs[kind] = (ddp, torch.optim.SGD(ddp.parameters(), lr=1e-3), [])
    params = sum(p.numel() for p in runs["gloo"][0].parameters())
    for i in range(3 + steps):
        for kind in KINDS:
            ddp, opt, rows = runs[kind]
            x, y = make_batch(gen, batch)
            before, c0, t0 = thread_cpu(), time.thread_time(), time.perf_counter()
            opt.zero_grad(set_to_none=False)
            if kind == "compute":
                with ddp.no_sync():
                    loss_fn(ddp(x), y).backward()
            else:
                loss_fn(ddp(x), y).backward()
            opt.step()
            t1, c1, after = time.perf_counter(), time.thread_time(), thread_cpu()
            if i >= 3:
                rows.append({"step_s": t1 - t0, "main_cpu_s": c1 - c0,
                             "threads_cpu_s": {k: v - before.get(k, 0.0)
                                               for k, v in after.items()}})
    compute = float(np.median([r["step_s"] for r in runs["compute"][2]]))
    out = {"parameters": params, "gradient_bytes": 4 * params}
    for kind in KINDS:
        rows = runs[kind][2]
        threads = sorted({k for r in rows for k in r["threads_cpu_s"]})
        out[kind] = {
            "step_ms": float(np.median([r["step_s"] for r in rows])) * 1e3,
            "exposed_comm_ms": (float(np.median([r["step_s"] for r in rows])) - compute) * 1e3,
            "main_cpu_ms": float(np.median([r["main_cpu_s"] for r in rows])) * 1e3,
            "threads_cpu_ms": {k: float(np.median([r["threads_cpu_s"].get(k, 0.0)
                                                   for r in rows])) * 1e3 for k in threads}}
    return out


def table(paths) -> str:
    out = []
    for path in paths:
        data = json.loads(open(path).read())
        out.append(f"**N = {data['ranks']}** (torch {data['torch']}, batch {data['batch']} per "
                   f"rank, median of {data['steps']} steps taken in turn, slowest rank; load "
                   f"average {load_of(data)} on 2 cores)\n")
        bf16 = all("bf16" in row["slowest"] for row in data["models"].values())
        out.append("| model | parameters | compute ms | mpicoll step ms | gloo step ms | "
                   "gloo / mpicoll | exposed comm. ms, mpicoll / gloo | "
                   "mpicoll threads' CPU ms per step |" +
                   (" bf16 hook step ms | gloo / bf16 hook |" if bf16 else ""))
        out.append("|---|---:|---:|---:|---:|---:|---:|---:|" + ("---:|---:|" if bf16 else ""))
        for name, row in data["models"].items():
            slow = row["slowest"]
            out.append(f"| {name} | {row['parameters'] / 1e6:.2f} M | {slow['compute']:.1f} | "
                       f"{slow['mpicoll']:.1f} | {slow['gloo']:.1f} | "
                       f"{slow['gloo'] / slow['mpicoll']:.2f} | "
                       f"{slow['mpicoll_exposed']:.1f} / {slow['gloo_exposed']:.1f} | "
                       f"{slow['mpicoll_threads_cpu']:.1f} |" +
                       (f" {slow['bf16']:.1f} | {slow['gloo'] / slow['bf16']:.2f} |"
                        if bf16 else ""))
        out.append("")
    return "\n".join(out)


def load_of(data: dict) -> str:
    """The 1-minute load average at the start and the end of the run (the end only in older
    runs)."""
    end = f"{data['load_average']:.1f}"
    return f"{data['load_average_start']:.1f} at the start, {end} at the end" \
        if "load_average_start" in data else end


def plot(data: dict, path) -> None:
    """Per model, the slowest rank's step on mpicoll and on Gloo: compute, then exposed
    communication stacked on it."""
    from _util import save_figure
    names = list(data["models"])

    def draw(plt):
        fig, ax = plt.subplots(figsize=(7, 3.5))
        x = np.arange(len(names))
        for i, kind in enumerate(("mpicoll", "gloo")):
            slow = [data["models"][n]["slowest"] for n in names]
            compute = np.array([r["compute"] for r in slow])
            step = np.array([r[kind] for r in slow])
            at = x + (i - 0.5) * 0.38
            ax.bar(at, compute, 0.36, color="0.75", label="compute" if i == 0 else None)
            ax.bar(at, step - compute, 0.36, bottom=compute, color=("C0", "C1")[i],
                   label=f"{kind}: exposed communication")
        ax.set_xticks(x, [f"{n}\n(mpicoll | gloo)" for n in names], fontsize=8)
        ax.set_yscale("log")        # (stacked: the exposed part's height is step - compute)
        ax.set_ylim(bottom=0.3 * min(data["models"][n]["slowest"]["compute"] for n in names))
        ax.set_ylabel("DDP step, ms (slowest rank)")
        ax.set_title(f"DDP step, N = {data['ranks']} (torch {data['torch']}, batch "
                     f"{data['batch']} per rank)", fontsize=9)
        ax.legend(fontsize=7)
        fig.tight_layout()
        return fig
    save_figure(path, draw)


def main() -> None:
    if sys.argv[1:2] == ["--table"]:
        print(table(sys.argv[2:]))
        return
    if sys.argv[1:2] == ["--plot"]:             # ddp_bench.py --plot A.json A.png
        plot(json.loads(open(sys.argv[2]).read()), sys.argv[3])
        return
    from datetime import timedelta

    import torch
    import torch.distributed as dist
    from mpi4py import MPI

    import mpicoll.torch  # noqa: F401 -- registers the backend
    from _util import outdir, parser, say, write_json
    ap = parser(__doc__)
    ap.add_argument("--models", default="mlp-0.2M,mlp-2M,mlp-10M,mlp-50M,transformer")
    ap.add_argument("--steps", type=int, default=20, help="timed steps per backend and model")
    ap.add_argument("--batch", type=int, default=32)
    args = ap.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("mpicoll", timeout=timedelta(minutes=10))
    groups = {"mpicoll": None, "gloo": dist.new_group(backend="gloo")}
    comm, rank, size = MPI.COMM_WORLD, dist.get_rank(), dist.get_world_size()
    load_start = os.getloadavg()[0]
    say(f"# N={size}, torch {torch.__version__}, batch {args.batch}, {args.steps} steps, "
        f"load average {load_start:.1f}")
    models = {}
    for name in args.models.split(","):
        mine = bench(name, groups, args.steps, args.batch, rank)
        every = comm.allgather(mine)
        worst = lambda f: max(f(r) for r in every)      # noqa: E731 -- the slowest rank
        slowest = {kind: worst(lambda r: r[kind]["step_ms"]) for kind in KINDS}
        slowest["mpicoll_exposed"] = worst(lambda r: r["mpicoll"]["exposed_comm_ms"])
        slowest["gloo_exposed"] = worst(lambda r: r["gloo"]["exposed_comm_ms"])
        slowest["bf16_exposed"] = worst(lambda r: r["bf16"]["exposed_comm_ms"])
        slowest["mpicoll_threads_cpu"] = worst(
            lambda r: sum(r["mpicoll"]["threads_cpu_ms"].values()))
        models[name] = {"parameters": mine["parameters"], "slowest": slowest, "ranks": every}
        say(f"{name:<12} {mine['parameters'] / 1e6:6.2f} M params: compute "
            f"{slowest['compute']:7.1f} ms, mpicoll {slowest['mpicoll']:7.1f} ms, gloo "
            f"{slowest['gloo']:7.1f} ms, gloo/mpicoll {slowest['gloo'] / slowest['mpicoll']:.2f}"
            f", bf16 hook {slowest['bf16']:7.1f} ms; mpicoll threads' CPU "
            f"{slowest['mpicoll_threads_cpu']:.1f} ms/step")
    if rank == 0:
        path = outdir(args.outdir) / f"ddp-np{size}.json"
        write_json(path, {"ranks": size, "torch": torch.__version__, "batch": args.batch,
                          "steps": args.steps, "load_average": os.getloadavg()[0],
                          "load_average_start": load_start,
                          "models": models})
        print(table([path]))
        plot(json.loads(path.read_text()), path.with_suffix(".png"))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
