"""The command line: every misuse is a one-line error with exit status 2, output says no more
than was checked, results are never lost at the end, and only bench and calibrate start MPI."""

import argparse
import io
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mpicoll import model, select, settings
from mpicoll.__main__ import COMMANDS, main
from mpicoll.tools import calibrate, trace
from mpicoll.tools.cli import Parser

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.timeout(120)


def status_of(*argv) -> int:
    try:
        return main(list(argv))
    except SystemExit as e:
        return e.code


def usage_error(capsys, *argv) -> str:
    """Runs ``mpicoll ARGV``; checks it printed one line on stderr, nothing on stdout, and
    exited with status 2; returns the line."""
    status = status_of(*argv)
    out, err = capsys.readouterr()
    assert status == 2, (status, out, err)
    assert out == "" and len(err.splitlines()) == 1, err
    return err


def mpicoll(*argv, timeout=120, cwd=ROOT, launcher=()):
    """``mpicoll ARGV`` in a subprocess (``launcher``: e.g. ``(mpiexec, "-n", "2")``)."""
    cmd = [*launcher, sys.executable, "-m", "mpicoll", *argv]
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout,
                          env=dict(os.environ, PYTHONPATH=str(ROOT)))


def bench_results(path, rows) -> str:
    """A small bench JSON: rows of (size, algorithm, time_us)."""
    records = [{"algorithm": a, "size": s, "count": s // 4, "inplace": False, "time_us": t,
                "busbw": s / t * 1e-3, "algbw": s / t * 1e-3, "vs_mpi": 1.0, "wrong": None}
               for s, a, t in rows]
    path.write_text(json.dumps({"nranks": 4, "nodes": 1, "collective": "allreduce",
                                "records": records}))
    return str(path)


# ----------------------------------------------------------------------------- mpicoll itself

def test_unknown_command_names_it_and_lists_the_commands(capsys):
    line = usage_error(capsys, "bogus")
    assert line.startswith("mpicoll: unknown command 'bogus'")
    assert all(name in line for name in COMMANDS)
    assert "no command" in usage_error(capsys)


def test_version_and_help(capsys):
    from mpicoll import __version__
    assert status_of("--version") == 0
    assert capsys.readouterr().out == f"mpicoll {__version__}\n"
    assert status_of("--help") == 0
    out = capsys.readouterr().out
    assert all(f"\n    {name} " in out for name in COMMANDS)


def parser_of(monkeypatch, command) -> Parser:
    """The parser ``mpicoll COMMAND`` builds, caught before it parses anything."""
    seen = []

    def catch(self, *args, **kwargs):
        seen.append(self)
        raise SystemExit(0)
    monkeypatch.setattr(Parser, "parse_args", catch)
    assert status_of(command) == 0
    return seen[0]


@pytest.mark.parametrize("command", list(COMMANDS))
def test_help_has_no_markup_and_every_option_its_help_and_default(monkeypatch, command):
    ap = parser_of(monkeypatch, command)
    text = ap.format_help()
    assert "``" not in text
    for action in ap._actions:
        assert action.help, f"{command} {action.dest} has no help"
        if action.option_strings and action.default not in (None, False, argparse.SUPPRESS):
            assert "default" in ap._get_formatter()._expand_help(action), \
                f"{command} {action.option_strings[0]} does not show its default"


def test_o_means_output_in_every_command(monkeypatch):
    for command in COMMANDS:
        ap = parser_of(monkeypatch, command)
        o = [a for a in ap._actions if "-o" in a.option_strings]
        assert not o or o[0].dest == "output", f"{command}: -o is --{o[0].dest}"


NO_MPI_PROGRAM = """
import contextlib, io, sys
from mpicoll.__main__ import main
with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
    try:
        main()                      # as the program: reads sys.argv
    except SystemExit:
        pass
from mpi4py import MPI
print("MPI initialised:", MPI.Is_initialized())
"""


@pytest.mark.timeout(600)      # eleven Python processes (matplotlib's import in two): minutes under load
def test_commands_without_communication_do_not_initialise_mpi(tmp_path):
    results = bench_results(tmp_path / "r.json", [(8, "ring", 9.0), (8, "binomial", 5.0)])
    for argv in (["trace", "ring"], ["model", "-N", "8"], ["report", results],
                 ["plot", results], ["tune", results, "-o", str(tmp_path / "t.json")],
                 ["--help"], ["--version"], ["bogus"], ["bench", "--help"], ["calibrate", "-h"],
                 ["bench", "-e", "1X"]):
        proc = subprocess.run([sys.executable, "-c", NO_MPI_PROGRAM, *argv], cwd=ROOT,
                              capture_output=True, text=True, timeout=60,
                              env=dict(os.environ, PYTHONPATH=str(ROOT)))
        want = "True" if argv == ["bench", "-e", "1X"] else "False"   # the control: it can fail
        assert proc.stdout.strip() == f"MPI initialised: {want}", (argv, proc.stdout + proc.stderr)


# ----------------------------------------------------------------------------- bench

@pytest.mark.parametrize("argv, says", [
    (["-e", "1X"], "not a size: '1X'"),
    (["-b", "1K", "-m", "8:2Q"], "not a size: '2Q'"),
    (["-n", "-3"], "-n/--iters: must be a positive integer, got '-3'"),
    (["-w", "-1"], "-w/--warmup: must be an integer >= 0"),
    (["-f", "0"], "-f/--stepfactor: must be a number >= 1"),
    (["-b", "1M", "-e", "8"], "empty size range"),
    (["-a", "ring,butterfly"], "unknown allreduce algorithm(s) ['butterfly']"),
    (["-o", "sum"], "unrecognized arguments: -o sum"),
    (["--profile", "/nonexistent.json"], "/nonexistent.json: no such profile file"),
    (["--timeout", "-1"], "--timeout: not a time: '-1' (expected seconds like 600, 10m"),
    (["-d", "complex64", "--op", "max"], "argument --op: op 'max' does not apply to dtype "
                                         "complex64 (MPI allows max on integer and floating "
                                         "types; complex64 is complex); ops for complex64: "
                                         "sum, prod"),
    (["-d", "bool"], "argument --op: op 'sum' does not apply to dtype bool"),
    (["-d", "bfloat16", "-a", "ring,mpi"], "the MPI library has no datatype for bfloat16"),
    (["-d", "float8"], "argument -d/--dtype: invalid choice: 'float8'"),
    (["--op", "maxloc"], "argument --op: invalid choice: 'maxloc'"),
])
def test_bench_misuse(capsys, argv, says):
    line = usage_error(capsys, "bench", *argv)
    assert line.startswith("mpicoll bench: error: ") and says in line, line


def test_bench_refuses_an_output_path_it_cannot_write_before_measuring(capsys, tmp_path):
    (tmp_path / "file").write_text("")
    line = usage_error(capsys, "bench", "--json", str(tmp_path / "file/r.json"))
    assert "is a file, not a folder" in line
    line = usage_error(capsys, "bench", "--csv", str(tmp_path))
    assert "is a folder, not a file" in line


# ----------------------------------------------------------------------------- trace

@pytest.mark.parametrize("argv, says", [
    (["binomial", "--collective", "bcast", "-N", "4", "--root", "7"],
     "--root 7 is out of range for N=4 (expected 0..3)"),
    (["ring", "--collective", "bcast", "-N", "4", "--root", "-1"], "--root -1 is out of range"),
    (["ring", "--count", "-5"], "--count: must be an integer >= 0, got '-5'"),
    (["ring", "-N", "0"], "-N/--nranks: must be a positive integer"),
    (["hierarchical", "--inner", "foo"], "unknown inner (or MPICOLL_HIER_INNER) 'foo'"),
    (["hierarchical", "--ranks-per-node", "0"], "--ranks-per-node: must be a positive integer"),
    (["ring", "--inner", "ring"], "--inner applies to node-aware algorithms, not 'ring'"),
    (["butterfly"], "name an algorithm of allreduce: ring,"),
    (["mpi"], "(not 'mpi')"),
    (["--update", "/nonexistent.md"], "--update /nonexistent.md: No such file or directory"),
])
def test_trace_misuse(capsys, argv, says):
    line = usage_error(capsys, "trace", *argv)
    assert line.startswith("mpicoll trace: error: ") and says in line, line


def test_trace_and_model_put_all_ranks_on_one_node_by_default():
    one_node = trace.render(trace.parser().parse_args(["hierarchical", "-N", "4"]))
    assert one_node == trace.render(trace.parser().parse_args(
        ["hierarchical", "-N", "4", "--ranks-per-node", "4"]))
    assert "ranks_per_node=4" in one_node.splitlines()[0]
    profile = model.load_profile()
    assert model.predict("ring", 8, 1 << 20, profile) == model.predict(
        "ring", 8, 1 << 20, profile, ranks_per_node=8)


# ----------------------------------------------------------------------------- model

def test_model_misuse(capsys, tmp_path):
    assert "-N/--nranks: must be a positive integer, got '0'" in usage_error(
        capsys, "model", "-N", "0")
    line = usage_error(capsys, "model", "--profile", "/nonexistent.json")
    assert "/nonexistent.json: no such profile file" in line and "pass --profile" not in line
    (tmp_path / "p.json").write_text("{}")
    assert "not a profile: alpha, beta, gamma missing" in usage_error(
        capsys, "model", "--profile", str(tmp_path / "p.json"))


def test_model_repeats_why_a_profile_is_unreliable(tmp_path, capsys):
    profile = model.load_profile()
    profile.meta = {"unreliable": ["intra link: the time does not grow with the size"]}
    profile.to_json(tmp_path / "p.json")
    assert status_of("model", "--profile", str(tmp_path / "p.json"), "-e", "64") == 0
    assert "# warning: the profile's beta is unreliable (mpicoll calibrate said: intra link: " \
        "the time does not grow" in capsys.readouterr().out


# ----------------------------------------------------------------------------- plot, report, tune

@pytest.mark.parametrize("command", ["plot", "report", "tune"])
@pytest.mark.parametrize("content, says", [
    ("{}", "not bench results"),
    ('{"nranks": 4, "nodes": 1, "records": [{"size": 8}]}', "record 0 is not a bench record: "
                                                             "no algorithm, inplace, time_us"),
    ("[1, 2", "cannot read bench results"),
])
def test_tools_refuse_what_is_not_bench_json(capsys, tmp_path, command, content, says):
    path = tmp_path / "x.json"
    path.write_text(content)
    line = usage_error(capsys, command, str(path))
    assert f"mpicoll {command}: error: {path}: {says}" in line, line


def test_plot_writes_next_to_the_json(tmp_path, monkeypatch):
    pytest.importorskip("matplotlib")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "run").mkdir()
    path = bench_results(tmp_path / "run/r.json", [(s, a, t) for s in (8, 1024)
                                                    for a, t in (("ring", 9.0), ("mpi", 4.0))])
    assert status_of("plot", path) == 0
    assert (tmp_path / "run/r.png").stat().st_size > 10_000
    assert not (tmp_path / "bench.png").exists()


def test_tune_stops_at_the_largest_measured_size(tmp_path, capsys):
    path = bench_results(tmp_path / "r.json", [
        (8, "binomial", 5.0), (8, "ring", 9.0),
        (65536, "binomial", 50.0), (65536, "ring", 90.0)])
    assert status_of("tune", path, "-o", str(tmp_path / "t.json")) == 0
    ranges = json.loads((tmp_path / "t.json").read_text())["allreduce"]["4"]
    assert ranges == [{"max_bytes": 65536, "algorithm": "binomial"}]
    out = capsys.readouterr().out
    assert "binomial up to 65536 B; above 65536 B (not measured) auto asks the cost model" in out


def test_tune_never_records_shm(tmp_path):
    """shm won the sweep (one node), but the table also serves calls across nodes, where shm
    can't run: auto's shm decision is select.shm_wins', and the table names the runner-up."""
    path = bench_results(tmp_path / "r.json", [
        (65536, "shm", 20.0), (65536, "ring", 50.0), (65536, "binomial", 90.0)])
    assert status_of("tune", str(path), "-o", str(tmp_path / "t.json")) == 0
    ranges = json.loads((tmp_path / "t.json").read_text())["allreduce"]["4"]
    assert ranges == [{"max_bytes": 65536, "algorithm": "ring"}]


def test_tune_keys_a_sweep_across_nodes_by_its_layout_and_keeps_variant_options(tmp_path):
    """A sweep on 4 nodes x 2 (the shaped fabric's bench, jobs/experiments/fabric_bench.py: NAME@KEY=VALUE
    variants, its fabric named) is the table's "8/2" row, with the variant's options; variants
    auto can't run (an unknown option or value) are left out."""
    path = tmp_path / "r.json"
    records = [{"algorithm": a, "size": s, "count": s // 4, "inplace": False, "time_us": t}
               for s, a, t in ((8, "recursive_doubling", 5.0), (8, "ring@order=node", 9.0),
                               (1 << 20, "hierarchical@inner=shm", 40.0),
                               (1 << 20, "hierarchical@inner=bogus", 10.0),
                               (1 << 20, "ring@colour=red", 10.0),
                               (1 << 20, "recursive_halving", 60.0))]
    path.write_text(json.dumps({"nranks": 8, "nodes": 4, "ranks_per_node": 2,
                                "fabric": "veth-1g", "collective": "allreduce",
                                "records": records}))
    assert status_of("tune", str(path), "-o", str(tmp_path / "t.json")) == 0
    table = json.loads((tmp_path / "t.json").read_text())["allreduce"]
    assert list(table) == ["8/2"]
    assert table["8/2"] == [
        {"max_bytes": 8, "algorithm": "recursive_doubling"},
        {"max_bytes": 1 << 20, "algorithm": "hierarchical", "options": {"inner": "shm"}}]
    records.append({"algorithm": "mpi", "size": 8, "count": 2, "inplace": False, "time_us": 1.0})
    path.write_text(json.dumps({"nranks": 8, "nodes": 4, "ranks_per_node": 2,
                                "fabric": "veth-1g", "collective": "allreduce",
                                "records": records}))
    assert status_of("tune", str(path), "-o", str(tmp_path / "t.json")) == 0
    assert json.loads((tmp_path / "t.json").read_text())["allreduce"]["8/2"][0] == \
        {"max_bytes": 8, "algorithm": "recursive_doubling"}             # mpi: only if asked
    assert status_of("tune", str(path), "--with-mpi", "-o", str(tmp_path / "t.json")) == 0
    assert json.loads((tmp_path / "t.json").read_text())["allreduce"]["8/2"][0] == \
        {"max_bytes": 8, "algorithm": "mpi"}


def test_select_asks_the_model_beyond_the_table(tmp_path, monkeypatch):
    table = {"allreduce": {"4": [{"max_bytes": 65536, "algorithm": "binomial"}]}}
    (tmp_path / "t.json").write_text(json.dumps(table))
    monkeypatch.setenv("MPICOLL_TUNING", str(tmp_path / "t.json"))
    settings.reload()
    try:
        assert select.choose("allreduce", 65536, 4, 16384) == "binomial"
        beyond = 1 << 24
        predicted = model.predict_all(4, beyond, model.load_profile())
        assert select.choose("allreduce", beyond, 4, beyond // 4) == min(predicted, key=predicted.get)
        assert min(predicted, key=predicted.get) != "binomial"   # so the test can fail
    finally:
        monkeypatch.undo()
        settings.reload()


def test_shipped_table_ends_at_measured_sizes():
    table = json.loads((settings.PROFILES / "tuning.json").read_text())
    for per_n in table.values():
        for ranges in per_n.values():
            assert all(isinstance(r["max_bytes"], int) for r in ranges), ranges


# ----------------------------------------------------------------------------- calibrate

def test_calibrate_refuses_too_few_sizes_for_beta(capsys):
    line = usage_error(capsys, "calibrate", "-e", "256K")
    assert "too few sizes to fit beta" in line and "-e 2M or more" in line
    assert "-n/--iters: must be a positive integer" in usage_error(capsys, "calibrate", "-n", "0")


def test_calibrate_fit():
    sizes = calibrate.message_sizes(4 << 20)
    line = [2e-6 + 1e-10 * s for s in sizes]
    alpha, beta, problems = calibrate.fit(sizes, line)
    assert alpha == line[0] and beta == pytest.approx(1e-10) and problems == []
    with pytest.raises(ValueError, match="at least 3 sizes >= 65536 B, got 1"):
        calibrate.fit(calibrate.message_sizes(256 << 10), line)
    falling = [1e-3 - 1e-10 * s for s in sizes]
    assert "does not grow" in calibrate.fit(sizes, falling)[2][0]
    noisy = line[:-3] + [2e-4, 1e-5, 2.5e-4]             # 128K slower than 512K
    assert "far from a line (R^2 = 0.26 < 0.9)" in calibrate.fit(sizes, noisy)[2][0]


def test_bench_offers_every_dtype_and_op():
    """-d and --op list what the kernels have (kept as names there, so --help needs no numba)."""
    from mpicoll import kernels
    from mpicoll.tools import bench
    assert bench.DTYPES == tuple(str(d) for d in kernels.DTYPES)
    assert bench.OPS == kernels.OPS
    assert all(bench._dtype(name) == d for name, d in zip(bench.DTYPES, kernels.DTYPES))


# ----------------------------------------------------------------------------- issue 21: no surprises

def test_bench_leaves_out_what_an_algorithm_refuses_for_every_dtype_and_op():
    """Every dtype x op MPI allows: the algorithms bench would run are those that take the pair
    (shm's own supports() decides for shm); none is left out without a reason."""
    from mpicoll import kernels
    from mpicoll.algorithms import allreduce_shm
    from mpicoll.registry import ALLREDUCE
    from mpicoll.tools import bench
    left_out = 0
    for dtype in kernels.DTYPES:
        for op in kernels.ops_for(dtype):
            for name in ALLREDUCE:
                why = bench.refusal("allreduce", name, op, dtype)
                if name == "shm":
                    assert (why is None) == allreduce_shm.supports(op, dtype), (op, dtype, why)
                    left_out += why is not None
                    assert why is None or f"{op} on {dtype}" in why
                else:
                    assert why is None, (name, op, dtype, why)
            assert bench.refusal("allgather", "ring", op, dtype) is None
    assert left_out == 0                        # shm runs every pair now (mpicoll.shm)


def test_bench_refusal_names_the_pair_an_algorithm_refuses(monkeypatch):
    """An algorithm whose module's supports() says no is left out with the pair named."""
    from mpicoll import kernels
    from mpicoll.algorithms import allreduce_shm
    from mpicoll.tools import bench
    monkeypatch.setattr(allreduce_shm, "supports", lambda op, dtype: op != "band", raising=False)
    why = bench.refusal("allreduce", "shm", "band", kernels.DTYPES[0])
    assert why is not None and f"band on {kernels.DTYPES[0]}" in why
    assert bench.refusal("allreduce", "shm", "sum", kernels.DTYPES[0]) is None


class _Comm:
    """Enough of a communicator for bench's helpers: ``allgather`` over given values."""

    def __init__(self, values):
        self.values = values

    def allgather(self, mine):
        return self.values(mine)


def test_bench_first_call_turns_a_refusal_into_a_line():
    from mpicoll.tools import bench

    class Case:
        comm = _Comm(lambda mine: [mine, mine])

        def call(self, algorithm, timeout):
            if algorithm == "picky":
                raise ValueError("algorithm='picky' supports op sum, not 'band'\nmore")

    assert bench.first_call(Case(), "ring", 10) is None
    assert bench.first_call(Case(), "picky", 10) == "algorithm='picky' supports op sum, not 'band'"


def test_bench_warns_when_ranks_outnumber_cores(monkeypatch):
    from mpicoll.tools import bench
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    four = _Comm(lambda mine: [mine] * 4)
    two = _Comm(lambda mine: [mine] * 2)
    assert "4 ranks share 2 cores on" in bench.oversubscribed(four)
    assert bench.oversubscribed(two) is None


def test_bad_environment_value_is_a_usage_error_before_bench_starts(capsys, monkeypatch):
    monkeypatch.setenv("MPICOLL_TIMEOUT", "abc")
    line = usage_error(capsys, "bench")
    assert line.startswith("mpicoll bench: error: MPICOLL_TIMEOUT must be a number of seconds "
                           "> 0, or 0 or inf for no timeout, got 'abc'"), line
    monkeypatch.setenv("MPICOLL_TIMEOUT", "10m")
    from mpicoll.tools import bench
    assert bench.parse_args(["--timeout", "2m"]).timeout == 120.0


def simulated(tmp_path) -> str:
    path = tmp_path / "sim.json"
    assert status_of("simulate", "-N", "4", "-e", "64", "-a", "ring", "--json", str(path)) == 0
    return str(path)


def test_report_and_tune_refuse_simulator_json_and_keep_the_table(capsys, tmp_path):
    path = simulated(tmp_path)
    capsys.readouterr()
    for command in ("report", "tune"):
        extra = ("-o", str(tmp_path / "tuning.json")) if command == "tune" else ()
        line = usage_error(capsys, command, path, *extra)
        assert f"{path}: simulator results (mpicoll simulate --json), not measured" in line
    assert not (tmp_path / "tuning.json").exists()


def test_report_without_mpi_column(capsys, tmp_path):
    """A bfloat16 sweep has no mpi (no MPI datatype): no vs_mpi to show, and no traceback."""
    path = bench_results(tmp_path / "r.json", [(8, "ring", 9.0), (8, "binomial", 5.0)])
    data = json.loads(Path(path).read_text())
    for r in data["records"]:
        r["vs_mpi"] = None
    Path(path).write_text(json.dumps(data))
    assert status_of("report", path) == 0
    assert "| 8 | 9.0 | **5.0** | - |" in capsys.readouterr().out


def test_report_into_a_closed_pipe_stops_quietly(tmp_path):
    path = bench_results(tmp_path / "r.json", [(s, a, 9.0) for s in range(8, 80000, 8)
                                                for a in ("ring", "binomial")])
    proc = subprocess.run(f"{sys.executable} -m mpicoll report {path} | head -1", shell=True,
                          cwd=ROOT, capture_output=True, text=True, timeout=60,
                          env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert proc.stdout.startswith("*allreduce, 4 ranks")
    assert proc.stderr == "", proc.stderr


def test_plot_refuses_an_unknown_format_and_a_missing_folder(capsys, tmp_path):
    pytest.importorskip("matplotlib")
    path = bench_results(tmp_path / "r.json", [(8, "ring", 9.0), (8, "mpi", 4.0)])
    line = usage_error(capsys, "plot", path, "-o", str(tmp_path / "out.xyz"))
    assert "'xyz' is not a figure format; name a file ending in one of" in line and ".png" in line
    missing = tmp_path / "no" / "such" / "x.png"
    line = usage_error(capsys, "plot", path, "-o", str(missing))
    assert f"the folder {missing.parent} does not exist" in line
    assert not (tmp_path / "no").exists()


def test_plot_draws_simulator_json(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    path = simulated(tmp_path)
    assert status_of("plot", path, "-o", str(tmp_path / "sim.png")) == 0
    assert (tmp_path / "sim.png").stat().st_size > 10_000


def test_tune_says_what_it_leaves_out(tmp_path, capsys):
    path = bench_results(tmp_path / "r.json", [
        (65536, "shm", 20.0), (65536, "ring", 50.0), (65536, "hierarchical", 40.0),
        (65536, "naive", 45.0)])
    assert status_of("tune", path, "-o", str(tmp_path / "t.json")) == 0
    out = capsys.readouterr().out
    assert "# left out: shm (runs on one node only" in out
    assert "# left out: hierarchical (node-aware, measured on one node" in out
    assert "# left out: naive (a teaching baseline" in out
    assert "# left out: ring" not in out


@pytest.mark.parametrize("argv, says", [
    (["model", "-N", "4", "-f", "1"], "-f 1 makes 67108857 sizes from 8 to 67108864 B, more "
                                      "than 10000: use a larger -f"),
    (["bench", "-f", "1", "-e", "1M"], "-f 1 makes 1048569 sizes"),
    (["trace", "ring", "-N", "100000"], "-N 100000: trace prints every step of every rank"),
    (["simulate", "--alpha", "2", "--bandwidth", "25GB/s", "-N", "8"],
     "--alpha: '2' without a unit is 2 s; give the unit (e.g. 2us)"),
    (["simulate", "--alpha", "2us", "--bandwidth", "25", "-N", "8"],
     "--bandwidth: '25' without a unit is 25 B/s; give the unit (e.g. 25GB/s)"),
])
def test_long_or_unit_less_runs_are_refused(capsys, argv, says):
    line = usage_error(capsys, *argv)
    assert says in line, line


def test_bare_numbers_that_are_plausible_stay_accepted():
    from mpicoll.tools.simulate import parse_bandwidth, parse_seconds
    assert parse_seconds("2e-6") == 2e-6 and parse_seconds("2us") == 2e-6
    assert parse_bandwidth("25e9") == 25e9 and parse_bandwidth("25GB/s") == 25e9


# ----------------------------------------------------------------------------- issue 44: no small lies

def test_model_charges_naive_a_latency_per_message(capsys):
    """naive sends N-1 messages in its one step: at N = 1024 its 8 B time is over 1023 alphas,
    so the model never calls it best there (it did at 5.07 us, one alpha)."""
    assert main(["model", "-N", "1024", "-b", "8", "-e", "8"]) == 0
    lines = capsys.readouterr().out.splitlines()
    names = lines[1].split()[1:-1]
    row = lines[2].split()
    profile = model.load_profile()
    naive = float(row[1 + names.index("naive")]) * 1e-6
    assert naive >= 1023 * profile.alpha and row[-1] != "naive", lines


def test_size_ranges_end_at_the_largest_size():
    """-b 8 -e 4M -f 4 (run.sh bench, the README's "8 B to 4 MiB (x4)") ends at 4 MiB, after 2 MiB
    (a shorter last step, as OSU ends at its MAX); the size-count check counts the same sizes."""
    from mpicoll.tools.sizes import sizes_from, too_many_sizes
    assert sizes_from(8, 4 << 20, 4) == [8 * 4 ** k for k in range(10)] + [4 << 20]
    assert sizes_from(8, 2 << 20, 4)[-2:] == [512 << 10, 2 << 20]        # on the grid: as before
    assert sizes_from(5, 7, 1) == [5, 6, 7] and sizes_from(9, 8, 4) == []
    assert "-b 8 -e 4M -f 4" in (ROOT / "run.sh").read_text()
    for lo, hi, f in ((8, 4 << 20, 4), (8, 4 << 20, 2), (1024, 4 << 30, 10), (3, 1000, 1.5)):
        assert f"makes {len(sizes_from(lo, hi, f))} sizes" in too_many_sizes(lo, hi, f, limit=0)


@pytest.mark.parametrize("argv", [[], ["-a", "ring,shm"], ["--reproducible"]])
def test_bench_names_every_algorithm_it_leaves_out(argv):
    """What bench would run, less what it runs, is what its # not run: lines name: mpi on
    bfloat16 (no MPI datatype), shm across nodes."""
    from mpicoll.registry import ALLREDUCE
    from mpicoll.tools import bench
    default = [a for a in ALLREDUCE if a != "mpi"] + ["auto", "mpi"]
    for dtype, nodes in (("bfloat16", 1), ("float32", 2), ("bfloat16", 2), ("float32", 1)):
        args = bench.parse_args(argv + ["-d", dtype])
        wanted = (argv[1].split(",") + ["mpi"] if "-a" in argv else
                  ["auto", "reproducible", "mpi"] if argv else default)
        run, skipped = bench.to_run(args, nodes)
        assert sorted(run + list(skipped)) == sorted(wanted), (argv, dtype, nodes)
        assert ("mpi" in skipped) == (dtype == "bfloat16")
        assert ("shm" in skipped) == ("shm" in wanted and nodes > 1)
        if "mpi" in skipped:
            assert "no datatype for bfloat16" in skipped["mpi"]


def test_bench_help_says_what_the_code_does(capsys):
    """bench -h: no dtype limit shm no longer has; the defaults and rules it quotes are the
    code's."""
    from mpicoll.algorithms import allreduce_shm
    from mpicoll import kernels
    from mpicoll.tools import bench
    assert status_of("bench", "-h") == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "4- and 8-byte" not in text
    assert all(allreduce_shm.supports(op, d) for d in kernels.DTYPES for op in kernels.ops_for(d))
    assert f"a {bench.VOLUME >> 20} MiB volume per size, 5 to 200" in text
    args = bench.parse_args([])
    assert (args.minbytes, args.maxbytes, args.stepfactor, args.warmup) == (8, 4 << 20, 4, 5)
    assert "the last step ends at -e" in text and "mpi is added anyway" in text
    assert bench.to_run(bench.parse_args(["-a", "ring"]), 1)[0] == ["ring", "mpi"]


def test_bench_warns_once_and_notes_why_pred_is_off(monkeypatch, capsys):
    """On a crowded node the warning is one line on stderr (none on stdout), and a note under
    the table says pred(us) leaves out ranks sharing cores; one rank alone says how to launch."""
    from mpi4py import MPI
    from mpicoll.tools import bench
    monkeypatch.setattr(bench, "oversubscribed", lambda comm: "4 ranks share 2 cores on vm")
    comm = MPI.COMM_SELF.Dup()
    try:
        bench.run(comm, bench.parse_args(["-b", "8", "-e", "8", "-n", "1", "-w", "0",
                                          "-a", "ring"]))
    finally:
        comm.Free()
    out, err = capsys.readouterr()
    assert "share 2 cores" not in out and err.count("share 2 cores") == 1, (out, err)
    assert "mpicoll bench: warning: 1 rank: a collective over one rank moves nothing" in err
    assert "mpiexec -n 4 mpicoll bench" in err
    note = [line for line in out.splitlines() if line.startswith("# note: pred(us)")]
    assert len(note) == 1 and "share cores" in note[0], out
    assert bench.alone(2) is None


def test_pred_note_names_a_profile_from_elsewhere():
    from mpicoll.tools import bench
    profile = model.load_profile()
    here = profile.meta["hosts"]
    assert bench.pred_note(profile, "p.json", here, None) is None
    note = bench.pred_note(profile, "p.json", ["elsewhere"], None)
    assert f"measured on {', '.join(here)}, not here" in note and "mpicoll calibrate" in note
    assert "share cores" in bench.pred_note(profile, "p.json", here, "crowded")


def test_simulate_checks_the_fabric_before_the_layout(capsys):
    line = usage_error(capsys, "simulate", "--fabric", "dgx-b200")
    assert "unknown fabric 'dgx-b200'" in line and "-N" not in line, line
    line = usage_error(capsys, "simulate", "--fabric", "dgx-h100", "-a", "butterfly")
    assert "unknown allreduce algorithm 'butterfly'" in line, line
    assert "give -N RANKS" in usage_error(capsys, "simulate", "--fabric", "dgx-h100")


class _Stream(io.StringIO):
    def __init__(self, tty):
        super().__init__()
        self.tty = tty

    def isatty(self):
        return self.tty


@pytest.mark.parametrize("tty", [False, True])
def test_simulate_shows_progress_on_long_runs(tty):
    """A line every few seconds in a log, a bar redrawn on a terminal (erased before a row is
    printed and at the end); nothing for a run shorter than ``after``."""
    from mpicoll.tools.simulate import Progress
    stream = _Stream(tty)
    progress = Progress(4, stream, every=0.05, after=0.0)
    progress.row(1, "8 B ring")
    time.sleep(0.3)
    with progress.aside():
        shown = stream.getvalue()
    progress.close()
    assert "1/4 rows done, simulating 8 B ring, 0:00 elapsed" in shown, shown
    if tty:
        assert "\r[#####...............] 1/4 rows done" in shown and shown.endswith("\r\x1b[K")
        assert stream.getvalue() == shown                    # erased already, nothing more
    else:
        assert shown.count("mpicoll simulate: 1/4 rows done") >= 2 and "\r" not in shown
    quiet = _Stream(tty)
    Progress(4, quiet, every=0.05, after=5.0).close()
    assert quiet.getvalue() == ""
