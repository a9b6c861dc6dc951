"""The package's structure: tools import the library and never the reverse, no import cycle,
algorithms are asked what they need (not compared by name), and one table declares every
``MPICOLL_*`` variable, which docs/reference/settings.md's tables quote."""

import ast
import re
from pathlib import Path

import pytest

from mpicoll import registry, settings

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "mpicoll"


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in PACKAGE.rglob("*.py")}


def imports(name: str) -> set[str]:
    """The mpicoll modules ``name`` imports (at any depth of its code), as module names."""
    path = MODULES[name]
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(up + ([base] if base else []))
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base
                       for a in node.names]
        else:
            continue
        found.update(t for t in targets if t in MODULES and t != "mpicoll")
    return found


GRAPH = {name: imports(name) for name in MODULES}


def test_the_library_never_imports_the_tools():
    offenders = {m: sorted(t for t in deps if t.startswith("mpicoll.tools"))
                 for m, deps in GRAPH.items() if not m.startswith("mpicoll.tools")}
    assert not {m: t for m, t in offenders.items() if t}


def test_the_walk_sees_imports():
    assert "mpicoll.registry" in GRAPH["mpicoll.api"]
    assert "mpicoll.simulators.inprocess" in GRAPH["mpicoll.tools.trace"]
    assert "mpicoll._runtime.call" in GRAPH["mpicoll.api"]


def test_jobs_use_the_public_api():
    """jobs/ (labs and experiments) import no private module of mpicoll: what a job needs of
    the runtime comes through mpicoll.testing (nodes, traffic, exit_in_next_call); timers of
    private steps sit in tests/internals/."""
    private = []
    for path in sorted((ROOT / "jobs").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            private += [f"{path.relative_to(ROOT)}: {n}" for n in names
                        if n.startswith("mpicoll.") and any(part.startswith("_")
                                                            for part in n.split(".")[1:])]
    assert len(list((ROOT / "jobs").rglob("*.py"))) > 30          # the walk found the jobs
    assert private == []


def test_no_import_cycle():
    index, low, stack, on_stack, cycles = {}, {}, [], set(), []

    def visit(v):                                   # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in GRAPH[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1 or v in GRAPH[v]:
                cycles.append(sorted(component))

    for v in GRAPH:
        if v not in index:
            visit(v)
    assert not cycles


def test_algorithms_are_not_named_in_code():
    """Only the registry and the algorithm's own module say "hierarchical"; the rest of the
    package asks the registry (``algo.has("node-layout")``, declared options)."""
    allowed = {"mpicoll.registry", "mpicoll.algorithms.allreduce_hierarchical"}
    named = [m for m, p in MODULES.items()
             if m not in allowed and re.search(r"""["']hierarchical["']""", p.read_text())]
    assert not named


def test_declared_options_and_aliases():
    hier = registry.lookup("allreduce", "hierarchical")
    assert [o.name for o in hier.options] == ["inner", "outer"]
    assert hier.has("node-layout") and not hier.library
    assert registry.lookup("allreduce", "mpi").library
    assert registry.lookup("allreduce", "reduce_scatter_allgather").name == "recursive_halving"
    assert registry.lookup("bcast", "scatter_ring_allgather").name == "ring"
    with pytest.raises(ValueError, match="unknown allreduce algorithm 'butterfly'"):
        registry.lookup("allreduce", "butterfly")
    names = [n for t in registry.COLLECTIVES.values() for a in t.values()
             for n in (a.name,) + a.aliases]
    for table in registry.COLLECTIVES.values():
        for a in table.values():
            assert set(a.restrictions) <= set(registry.TOKENS), a.name
            assert not set(a.aliases) & set(table), f"alias of {a.name} shadows an algorithm"
    assert names


def test_every_variable_is_declared():
    """Every MPICOLL_* name in the code, scripts and docs is in the settings table, and every
    library variable the package reads goes through it (no os.environ lookups elsewhere)."""
    declared = {s.name for s in settings.LIBRARY + settings.SCRIPTS}
    files = [p for pattern in ("mpicoll/**/*.py", "tests/**/*.py", "tests/*.sh", "jobs/**/*.py",
                               "docs/generators/*.py", "slurm/**/*", "run.sh", ".ci/run",
                               "docs/**/*.md", "README.md")
             for p in ROOT.glob(pattern) if p.is_file()]
    used = {name for p in files for name in re.findall(r"MPICOLL_[A-Z_]*[A-Z]", p.read_text())}
    misspelled = {"MPICOLL_TIMOUT", "MPICOLL_SEGMENT_BYTE", "MPICOLL_ZZZZ"}   # test_bad_settings
    assert used - declared == misspelled
    readers = [m for m, p in MODULES.items() if m != "mpicoll.settings"
               and re.search(r"environ(\.get)?\(?\[?[\"']MPICOLL_", p.read_text())]
    assert not readers


@pytest.mark.parametrize("which", ["library", "scripts"])
def test_settings_reference_is_the_settings_table(which):
    table = settings.LIBRARY if which == "library" else settings.SCRIPTS
    page = "docs/reference/settings.md"
    block = re.search(rf"<!-- settings: {which} -->\n(.*?)<!-- end settings -->",
                      (ROOT / page).read_text(), re.S)
    assert block, f"{page} has no <!-- settings: {which} --> block"
    assert block[1] == settings.markdown_table(table), \
        "stale table; run: python docs/make-reference.py"


def test_bad_values_name_the_variable(monkeypatch):
    for name, value in [("MPICOLL_RANKS_PER_NODE", "abc"), ("MPICOLL_RANKS_PER_NODE", "0"),
                        ("MPICOLL_KERNELS", "foo"), ("MPICOLL_TUNING", "/nonexistent.json"),
                        ("MPICOLL_PROFILE", "/nonexistent.json"), ("MPICOLL_SHORT_MSG", "-1"),
                        ("MPICOLL_TIMEOUT", "-1"), ("MPICOLL_VALIDATE", "yes")]:
        monkeypatch.setenv(name, value)
        settings.reload()
        with pytest.raises(ValueError, match=name):
            settings.get(name)
        monkeypatch.delenv(name)
    settings.reload()
    assert settings.get("MPICOLL_KERNELS") == "numba"
    assert settings.get("MPICOLL_RANKS_PER_NODE") is None
    monkeypatch.setenv("MPICOLL_RANKS_PER_NODE", "3")
    assert settings.get("MPICOLL_RANKS_PER_NODE") is None       # cached until reload()
    settings.reload()
    assert settings.get("MPICOLL_RANKS_PER_NODE") == 3
    monkeypatch.delenv("MPICOLL_RANKS_PER_NODE")
    settings.reload()


def test_package_exports_and_aliases_in_the_api():
    import numpy as np
    from mpi4py import MPI

    import mpicoll
    assert issubclass(mpicoll.CommunicatorBroken, RuntimeError)
    assert "CommunicatorBroken" in mpicoll.__all__
    x = np.arange(5.0)
    out = mpicoll.allreduce(x, algorithm="reduce_scatter_allgather", comm=MPI.COMM_SELF)
    assert np.array_equal(out, x)
    buf = np.arange(3.0)
    assert mpicoll.bcast(buf, algorithm="scatter_ring_allgather", comm=MPI.COMM_SELF) is buf
