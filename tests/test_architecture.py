"""The package's shape (issue 21): imports run one way. Every ``import`` of a slurm_ft module,
at module level or inside a function, is an arrow; the arrows make no cycle."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "slurm_ft"


def _modules() -> dict[str, Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = path
    return out


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The slurm_ft modules ``name`` imports (a name imported from a package counts as the
    submodule when there is one, else as the package)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name in modules)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = ".".join(base[:len(base) - (node.level - 1)])
                target = f"{base}.{node.module}" if node.module else base
            else:
                target = node.module or ""
            if target not in modules:
                continue
            for a in node.names:
                out.add(f"{target}.{a.name}" if f"{target}.{a.name}" in modules else target)
    out.discard(name)
    return out


def graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: _imports(name, path, modules) for name, path in modules.items()}


def cycles(g: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(g.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(g):
        if v not in index:
            visit(v)
    return out


def test_the_import_graph_has_no_cycle():
    g = graph()
    assert len(g) > 100 and "slurm_ft.failover.machine" in g and "slurm_ft.slurm.records" in g["slurm_ft.failover.machine"]
    assert cycles(g) == []


def test_the_cycle_finder_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_the_test_doubles_are_not_in_the_package():
    assert not (PACKAGE / "testing").exists()
    assert not [p for p in PACKAGE.rglob("*.py") if p.name.startswith("fake_slurm")]


#: What a module that runs commands, talks to a socket, a database or another process imports.
IO_MODULES = {"subprocess", "socket", "sqlite3", "sqlite_utils", "fcntl", "signal", "threading", "selectors",
              "multiprocessing", "http", "urllib.request", "shutil"}


def _stdlib_imports(path: Path) -> set[str]:
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            out.add(node.module)
    return out


def closure(g: dict[str, set[str]], start: str) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        for w in g.get(todo.pop(), ()):
            if w not in seen:
                seen.add(w)
                todo.append(w)
    return seen


def test_the_state_machine_reaches_no_module_that_does_io():
    """failover/machine.py plans from plain values: nothing it imports, directly or not, runs a
    command, opens a socket or a database, locks a file or starts a thread (it may read the
    packaged data tables: the classifier's catalog)."""
    g, modules = graph(), _modules()
    reached = closure(g, "slurm_ft.failover.machine") | {"slurm_ft.failover.machine"}
    assert "slurm_ft.slurm.records" in reached and "slurm_ft.failover.policy" in reached
    doing_io = {m: sorted(_stdlib_imports(modules[m]) & IO_MODULES) for m in reached}
    assert {m: io for m, io in doing_io.items() if io} == {}


def test_the_io_check_sees_io():
    modules = _modules()
    assert "subprocess" in _stdlib_imports(modules["slurm_ft.slurm"])
    assert "sqlite3" in _stdlib_imports(modules["slurm_ft.journal.store"])


def test_the_package_root_is_a_small_shared_core():
    """Code lives in rooms named for where it runs; the root keeps the shared core only (issue 21:
    at most 8 modules, ``__init__`` counted)."""
    root = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert "__init__.py" in root and "config.py" in root
    assert len(root) <= 8, root


def test_the_architecture_map_names_every_room():
    """docs/architecture.md opens with the map: one row per room of the package, nothing else first."""
    doc = (PACKAGE.parent / "docs" / "architecture.md").read_text()
    assert doc.startswith("# Architecture\n\n## The map: rooms by where their code runs\n")
    table = doc.split("\n## ", 2)[1]
    rows = {line.split("|")[1].strip().strip("`") for line in table.splitlines() if line.startswith("| `")}
    rooms = {p.name + "/" for p in PACKAGE.iterdir()
             if p.is_dir() and (p / "__init__.py").exists()}
    assert rooms - rows == set(), "rooms missing from the map"
    assert rows - rooms == set(), "the map names a room that is not there"
    for module in sorted(p.stem for p in PACKAGE.glob("*.py") if p.stem != "__init__"):
        assert f"`{module}`" in table, f"root module {module} is not in the map's root row"


def test_click_is_imported_in_the_cli_room_only():
    """Command lines live in ``slurm_ft/cli/``: no other module imports click (library code
    raises :mod:`slurm_ft.errors`; the cli room turns them into ``Error: ...``)."""
    users = sorted(str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("*.py")
                   if {"click"} & {m.split(".")[0] for m in _stdlib_imports(p)})
    assert users and all(u.startswith("cli/") for u in users), users
