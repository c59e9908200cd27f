"""The house's layering, read from the source: the edge (mlxserve/api) talks to the core
through its door (ChatService, ServedModels, Media) only, and nothing below the edge
imports it (server.py puts the two together)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import mlxserve

PACKAGE = Path(mlxserve.__file__).parent
EDGE = PACKAGE / "api"
# Behind the door: the generation thread, the models in memory, the loader, the drafters
# (all under engine/), and the catalog of what can be served.
BEHIND_THE_DOOR = ("mlxserve.engine", "mlxserve.models.catalog")
HIDDEN_NAMES = {"ModelCatalog", "GenerationWorker", "ResidentSet"}
HIDDEN_ATTRIBUTES = {"worker", "catalog"}


def modules(root: Path) -> list[Path]:
    return sorted(root.rglob("*.py"))


def imports(tree: ast.AST) -> list[tuple[str, list[str]]]:
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(alias.name, []) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.append((node.module, [alias.name for alias in node.names]))
    return found


def test_the_edge_reaches_the_core_through_its_door_only():
    breaches = []
    for path in modules(EDGE):
        tree = ast.parse(path.read_text(), str(path))
        where = path.relative_to(PACKAGE.parent)
        for module, names in imports(tree):
            if module.startswith(BEHIND_THE_DOOR) or HIDDEN_NAMES & set(names):
                breaches.append(f"{where}: imports {module} {names}")
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and node.attr in HIDDEN_ATTRIBUTES:
                breaches.append(f"{where}:{node.lineno}: .{node.attr}")
    assert breaches == []


def test_nothing_below_the_edge_imports_it():
    breaches = [
        f"{path.relative_to(PACKAGE.parent)}: imports {module}"
        for path in modules(PACKAGE)
        if EDGE not in path.parents and path.name != "server.py"
        for module, _ in imports(ast.parse(path.read_text(), str(path)))
        if module.startswith("mlxserve.api")
    ]
    assert breaches == []


def test_the_core_is_given_the_request_it_serves():
    """Who asks, the request's record, its client's leaving and its priority reach the
    core as a RequestContext argument (service/context.py): below the edge nothing reads
    the caller from the thread (keys/caller.py's `current_caller`, which the edge's record
    ownership reads), nor holds a context variable of its own, the request id's for log
    lines (telemetry/record.py) and a verify pass's recorded steps aside."""
    own_variables = {"telemetry/record.py", "engine/speculation/recurrent_steps.py"}
    breaches = []
    for path in modules(PACKAGE):
        where = str(path.relative_to(PACKAGE))
        if EDGE in path.parents or where.startswith("keys/"):
            continue
        for module, names in imports(ast.parse(path.read_text(), str(path))):
            if {"current_caller", "calling"} & set(names):
                breaches.append(f"{where}: imports {names} from {module}")
            if "contextvars" in (module, *names) and where not in own_variables:
                breaches.append(f"{where}: a context variable")
    assert breaches == []


def test_a_text_server_does_not_import_mlx_vlm():
    """mlx-vlm (its import is most of a second of a start) comes in with the first vision
    model (engine/continuous/batch_model.py): the server's modules, every kind registered,
    import none of it."""
    probe = (
        "import sys, mlxserve.server, mlxserve.cli; "
        "from mlxserve.registration import register_all; register_all(); "
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'mlx_vlm'}))"
    )
    found = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    assert found.returncode == 0, found.stderr
    assert found.stdout.strip() == "[]"
