"""Layers you can see: a static import graph over om_core, flows and deployments.

Every ``import`` and ``from … import`` counts, at any depth (inside functions too: a function-level
import may make a library faster to load, never hide a cycle), with relative imports resolved. Only an
``if TYPE_CHECKING:`` block is left out: it never runs, and the library names the workspace's type
there for its annotations (``ws: Workspace``) without depending on it.

The rooms, bottom up (ROOMS_BOTTOM_UP, drawn the same in docs/design.md): a room imports only its own
modules and the rooms below it, so no import runs up and no two rooms import each other. ``om_core``
there is the package's leaf modules (its version, errors, settings); ``om_core.X`` is room X;
``flows`` (with flows.cli, the `om` command line) and ``deployments`` are the shells on top.

Inside that order, the finer module layers, top to bottom (a module may import its own layer's
modules and any lower layer's):
    shell      flows.*, deployments.*
    workspace  om_core.store.workspace, and the modules that build one below the shells:
               om_core.replay.payload (a replay task's in-memory copy of a session's rows),
               om_core.replay.engine (the replay of such a copy) and om_core.eval.run (the
               evaluation's own database in its --out folder)
    library    every other om_core module, in its room
    storage    om_core.store (the package), om_core.store.db, .db_path, .sqlfiles, .migrations (find,
               open, migrate with frozen data steps, run named SQL)
    leaves     om_core (the package: its version), om_core.errors, om_core.settings, and Pi's own formats
               every layer speaks: om_core.pi (the package), om_core.pi.session (its JSONL lines),
               om_core.pi.tokens (its token estimate), om_core.pi.js_length (JavaScript string
               lengths); pure, importing only leaves
Storage imports only leaves (and each other); leaves import only leaves.

om_core holds only the leaves' two modules and its rooms, each for its SPEC sections; a package's
``__init__`` imports nothing of the project but its own modules, so entering a room costs nothing.

An edge is the module named: ``from om_core.ingest import plan`` is an edge to om_core.ingest.plan,
``from om_core.ingest import ingest`` (a name) one to om_core.ingest. Importing a package's module
from outside that package runs the package's ``__init__`` first, so that is an edge too (to
om_core.ingest, for the first example); a module's own enclosing packages are not (every module
would otherwise depend on its package).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("om_core", "flows", "deployments")
MAX_LINES = 500

LEAVES = {"om_core", "om_core.errors", "om_core.settings",
          "om_core.pi", "om_core.pi.session", "om_core.pi.tokens", "om_core.pi.js_length"}
STORAGE = {"om_core.store", "om_core.store.db", "om_core.store.db_path", "om_core.store.sqlfiles",
           "om_core.store.migrations"}
WORKSPACE = {"om_core.store.workspace", "om_core.replay.payload", "om_core.replay.engine", "om_core.eval.run"}

# The rooms, bottom up: each imports only itself and the rooms before it (docs/design.md draws this table).
ROOMS_BOTTOM_UP = ("om_core", "redaction", "pi", "store", "ledger", "memory", "recall", "ingest", "model",
                   "workers", "project", "replay", "report", "eval", "usecases", "flows", "deployments")
SHELLS = {"flows", "deployments"}
ROOMS = set(ROOMS_BOTTOM_UP) - SHELLS - {"om_core"}  # om_core's packages; nothing else sits in om_core
TOP_MODULES = {"__init__.py", "errors.py", "settings.py"}

# Known violations someone is fixing (remove each line when its fix is merged; the lists only shrink).
PENDING_CYCLES: set[frozenset[str]] = set()
PENDING_LAYER_EDGES: set[tuple[str, str]] = set()
PENDING_SIZES: set[str] = set()


def module_name(path: Path, root: Path = ROOT) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules(root: Path = ROOT) -> dict[str, Path]:
    return {module_name(p, root): p for package in PACKAGES for p in sorted((root / package).rglob("*.py"))}


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(node: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.If) and _is_type_checking(child.test):
            for other in child.orelse:  # the else branch runs
                yield from _imports_in(other)
            continue
        yield from _imports_in(child)


def _imports_in(node: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        yield node
    yield from _imports(node)


def imported_names(name: str, path: Path, known: set[str] | None = None) -> set[str]:
    """Every module ``name`` imports, as absolute names: for ``from pkg import x``, ``pkg.x`` where that
    is one of the ``known`` modules, else ``pkg``."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in _imports(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
            continue
        base = node.module or ""
        if node.level:
            anchor = package.split(".")
            anchor = anchor[: len(anchor) - (node.level - 1)]
            base = ".".join([*anchor, *([base] if base else [])])
        for alias in node.names:
            module = f"{base}.{alias.name}"
            found.add(module if known is not None and module in known else base)
            if known is None:
                found.add(module)
    return found


def graph(root: Path = ROOT) -> dict[str, set[str]]:
    """Module -> the project's modules it imports (outside names kept as they are, for the prefect check)."""
    mods = modules(root)
    edges: dict[str, set[str]] = {}
    for name, path in mods.items():
        targets = set()
        for imported in imported_names(name, path, set(mods)):
            if imported in mods:
                targets.add(imported)
                targets.update(_packages_initialised(name, imported, mods))
            elif imported.split(".")[0] not in PACKAGES:
                targets.add(imported)  # an outside library
        targets.discard(name)
        edges[name] = targets
    return edges


def _packages_initialised(importer: str, imported: str, mods: dict[str, Path]) -> set[str]:
    """The packages above ``imported`` whose ``__init__`` runs on the way: all but ``importer``'s own."""
    parts = imported.split(".")
    above = {".".join(parts[:i]) for i in range(1, len(parts))}
    own = {importer.rsplit(".", i)[0] for i in range(importer.count(".") + 1)}
    return {p for p in above - own if p in mods}


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each as one cycle's path."""
    inside = {n: {t for t in ts if t in edges} for n, ts in edges.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(inside[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(_cycle_path(sorted(component), inside))

    for node in sorted(inside):
        if node not in index:
            visit(node)
    return found


def _cycle_path(component: list[str], inside: dict[str, set[str]]) -> list[str]:
    """One cycle through the component's first module, as a readable path a -> b -> ... -> a."""
    members = set(component)
    start = component[0]
    paths = {start: [start]}
    queue = [start]
    while queue:
        node = queue.pop(0)
        for nxt in sorted(inside[node] & members):
            if nxt == start:
                return paths[node] + [start]
            if nxt not in paths:
                paths[nxt] = paths[node] + [nxt]
                queue.append(nxt)
    return component


def layer(name: str) -> int:
    if name in LEAVES:
        return 0
    if name in STORAGE:
        return 1
    if name.startswith("om_core."):
        return 3 if name in WORKSPACE else 2
    return 4  # flows, deployments


def room_of(module: str) -> str:
    """The room a module of the project sits in: ``om_core`` for the package's leaf modules."""
    parts = module.split(".")
    if parts[0] != "om_core":
        return parts[0]
    return "om_core" if len(parts) == 1 or f"{parts[1]}.py" in TOP_MODULES else parts[1]


def room_graph(edges: dict[str, set[str]]) -> dict[str, dict[str, list[str]]]:
    """Room -> the other rooms it imports, each with the module edges that make it (``a -> b``)."""
    rooms: dict[str, dict[str, list[str]]] = {}
    for name, targets in edges.items():
        for target in sorted(targets):
            if target.split(".")[0] not in PACKAGES:
                continue
            src, dst = room_of(name), room_of(target)
            if src != dst:
                rooms.setdefault(src, {}).setdefault(dst, []).append(f"{name} -> {target}")
    return rooms


def room_violations(edges: dict[str, set[str]], order: tuple[str, ...] = ROOMS_BOTTOM_UP) -> list[str]:
    """Every import between rooms that runs up the order, every room the order lacks, and every cycle
    of rooms (which an upward import always closes; named on its own so the message says which)."""
    rooms = room_graph(edges)
    rank = {room: i for i, room in enumerate(order)}
    found = sorted(f"room {room!r} is not in ROOMS_BOTTOM_UP ({module})" for module in edges
                   for room in [room_of(module)] if room not in rank)
    for src, targets in sorted(rooms.items()):
        for dst, why in sorted(targets.items()):
            if src in rank and dst in rank and rank[dst] > rank[src]:
                found.append(f"{src} imports {dst}, above it: {'; '.join(why)}")
    found += [f"rooms in a cycle: {' -> '.join(c)}" for c in cycles({r: set(ts) for r, ts in rooms.items()}
                                                                      | {r: set() for r in order if r not in rooms})]
    return found


def design_rooms(text: str) -> list[str]:
    """The rooms of docs/design.md's table, bottom up: the first column of each row after its heading."""
    lines = [line.strip() for line in text.splitlines()]
    start = next(i for i, line in enumerate(lines) if line.startswith("| room (bottom up)"))
    names = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        names.append(line.split("|")[1].strip().strip("`").removeprefix("om_core/").rstrip("/"))
    return names


def test_rooms_import_only_downwards_and_never_in_a_cycle():
    bad = room_violations(graph())
    assert not bad, "imports against the rooms' order (ROOMS_BOTTOM_UP):\n" + "\n".join(bad)


def test_the_design_page_draws_the_rooms_table():
    text = (ROOT / "docs" / "design.md").read_text(encoding="utf-8")
    assert design_rooms(text) == list(ROOMS_BOTTOM_UP)


def test_the_room_check_fails_on_an_upward_or_circular_import(tmp_path):
    """The checker itself, on a synthetic tree: a function-level import from store up into memory is
    caught, with the cycle it closes; the same import under TYPE_CHECKING is not."""
    def write(rel: str, text: str = "") -> None:
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)

    write("om_core/__init__.py")
    write("om_core/errors.py")
    write("om_core/store/__init__.py")
    write("om_core/memory/__init__.py")
    write("om_core/memory/views.py", "from om_core.store import db\n")
    write("om_core/store/db.py", "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                                 "    from om_core.memory.views import x\n")
    assert room_violations(graph(tmp_path)) == []  # memory -> store runs down; TYPE_CHECKING never runs

    write("om_core/store/db.py", "import om_core.errors\ndef f():\n    from om_core.memory.views import x\n")
    bad = room_violations(graph(tmp_path))
    assert any(v.startswith("store imports memory, above it: om_core.store.db -> om_core.memory") for v in bad), bad
    assert any(v.startswith("rooms in a cycle: ") and "memory" in v and "store" in v for v in bad), bad

    write("om_core/newroom/__init__.py", "import om_core.errors\n")
    assert any("'newroom' is not in ROOMS_BOTTOM_UP" in v for v in room_violations(graph(tmp_path)))


def test_no_import_cycle():
    found = [c for c in cycles(graph()) if frozenset(c) not in PENDING_CYCLES]
    assert not found, "import cycles:\n" + "\n".join(" -> ".join(c) for c in found)


def test_om_core_imports_no_shell_and_no_prefect():
    bad = sorted(f"{name} imports {target}" for name, targets in graph().items() if name.split(".")[0] == "om_core"
                 for target in targets if target.split(".")[0] in ("flows", "deployments", "prefect", "prefect_dask"))
    assert not bad, "\n".join(bad)


def test_om_core_is_its_rooms():
    top = ROOT / "om_core"
    assert {p.name for p in top.glob("*.py")} == TOP_MODULES
    assert {p.name for p in top.iterdir() if p.is_dir() and (p / "__init__.py").exists()} == ROOMS
    mods = modules()
    for room in sorted(ROOMS):  # a room's __init__ reaches only into its own room
        package = f"om_core.{room}"
        inside = {t for t in imported_names(package, mods[package], set(mods)) if t.split(".")[0] in PACKAGES}
        assert all(t.startswith(package + ".") for t in inside), (package, inside)


def test_flows_never_import_deployments():
    bad = sorted(f"{name} imports {target}" for name, targets in graph().items() if name.split(".")[0] == "flows"
                 for target in targets if target.split(".")[0] == "deployments")
    assert not bad, "\n".join(bad)


def test_layers_import_only_downwards():
    bad = []
    for name, targets in graph().items():
        for target in targets:
            if target.split(".")[0] not in PACKAGES or (name, target) in PENDING_LAYER_EDGES:
                continue
            if layer(target) > layer(name) or (layer(name) == 1 and layer(target) > 1):
                bad.append(f"{name} (layer {layer(name)}) imports {target} (layer {layer(target)})")
    assert not bad, "imports against the layer order:\n" + "\n".join(sorted(bad))


def test_no_module_over_500_lines():
    long = {}
    for path in modules().values():
        rel = path.relative_to(ROOT).as_posix()
        lines = len(path.read_text(encoding="utf-8").splitlines())
        if lines > MAX_LINES and rel not in PENDING_SIZES:
            long[rel] = lines
    assert not long, f"modules over {MAX_LINES} lines: {long}"


def test_the_pending_lists_only_name_what_is_still_there():
    """Each known violation is still one: a fixed one leaves its list (the lists only shrink)."""
    edges = graph()
    found_cycles = {frozenset(c) for c in cycles(edges)}
    assert PENDING_CYCLES <= found_cycles, PENDING_CYCLES - found_cycles
    assert {e for e in PENDING_LAYER_EDGES if e[1] in edges.get(e[0], ())} == PENDING_LAYER_EDGES
    sizes = {p for p in PENDING_SIZES if len((ROOT / p).read_text(encoding="utf-8").splitlines()) > MAX_LINES}
    assert sizes == PENDING_SIZES, PENDING_SIZES - sizes


def test_the_graph_sees_function_level_and_relative_imports(tmp_path):
    """The checker itself: an import inside a function counts, a relative one resolves, TYPE_CHECKING does not."""
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    source = pkg / "a.py"
    source.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import typed_only\n"
                      "def f():\n    from . import b\n    from .c import x\n    import om_core.store.db\n")
    names = imported_names("pkg.a", source, {"pkg", "pkg.a", "pkg.b", "pkg.c"})
    assert names == {"typing", "pkg.b", "pkg.c", "om_core.store.db"}  # b a module of pkg, x a name in pkg.c
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c", "a"]]
    mods = dict.fromkeys(["om_core", "om_core.ingest", "om_core.ingest.plan", "om_core.ingest.files", "flows.cli.x"])
    assert _packages_initialised("om_core.model.cost", "om_core.ingest.plan", mods) == {"om_core.ingest"}
    assert _packages_initialised("om_core.ingest.plan", "om_core.ingest.files", mods) == set()
    assert _packages_initialised("flows.cli.x", "om_core.ingest.plan", mods) == {"om_core", "om_core.ingest"}


def test_every_module_imports_on_its_own():
    """The runtime side of the graph: each module imported first, in a fresh state of the project's
    modules (third-party ones stay loaded, so one subprocess is enough), imports without error. A cycle
    the graph missed shows here as a partly initialised module. (``__main__`` modules are scripts.)"""
    import subprocess
    import sys

    script = (
        "import importlib, sys\n"
        f"names = {sorted(n for n in modules() if not n.endswith('__main__'))!r}\n"  # scripts run, not import
        f"ours = {PACKAGES!r}\n"
        "failed = []\n"
        "for name in names:\n"
        "    for loaded in [m for m in sys.modules if m.split('.')[0] in ours]:\n"
        "        del sys.modules[loaded]\n"
        "    try:\n"
        "        importlib.import_module(name)\n"
        "    except Exception as exc:\n"
        "        failed.append(f'{name}: {type(exc).__name__}: {exc}')\n"
        "print('\\n'.join(failed))\n"
        "sys.exit(1 if failed else 0)\n"
    )
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr[-2000:]
