"""Each package imports only the layers docs/dev/architecture.md allows, and each of the engine's wings
only the wings below it (read from the source, not run)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "multilora_studio"
# package -> the project's packages it may import (the top-level modules of SHARED: anyone)
ALLOWED = {
    "kernels": set(),
    "adapters": set(),
    "engine": {"kernels", "adapters", "default_model"},
    "server": {"engine", "adapters", "kernels", "deploy"},
    "deploy": {"engine", "adapters"},
    "ray_app": {"engine", "adapters", "server", "deploy"},
    "evaluate": {"engine", "adapters", "run_records"},
    "arena": {"engine", "evaluate", "run_records"},
    "runs": {"engine", "adapters", "evaluate"},
    "gui": {
        "arena",
        "runs",
        "server",
        "engine",
        "adapters",
        "evaluate",
        "demo",
        "resources",
        "kernels",
        "run_records",
        "divergence",
        "merge",
        "deploy",
        "bench",
        "default_model",
    },
    "demo": {"engine", "adapters", "default_model", "kernels"},
    "merge": {"engine", "adapters"},
    "bench": {"engine", "adapters", "server", "deploy", "kernels", "default_model"},
    "cli": {
        "arena",
        "runs",
        "gui",
        "server",
        "engine",
        "adapters",
        "evaluate",
        "demo",
        "bench",
        "default_model",
        "kernels",
        "run_records",
        "divergence",
        "merge",
        "deploy",
        "ray_app",
    },
    "default_model": set(),
    "run_records": {"engine"},
    "divergence": {"engine"},
}
SHARED = {
    "util",
    "paths",
    "resources",
    "checkpoint_files",
    "spawned",
    "chat_template_child",
    "invalid_setting",
    "sqlite_schema",
}
THIRD_PARTY_FORBIDDEN = {
    "kernels": {"PySide6", "fastapi", "uvicorn", "transformers"},
    "adapters": {"PySide6", "fastapi", "uvicorn"},
    "engine": {"PySide6", "fastapi", "uvicorn", "pyqtgraph"},
    "server": {"PySide6", "pyqtgraph"},
    "evaluate": {"PySide6", "fastapi", "uvicorn", "pyqtgraph"},
    "arena": {"PySide6", "fastapi", "uvicorn", "pyqtgraph"},
    "runs": {"PySide6", "fastapi", "uvicorn", "pyqtgraph"},
    "merge": {"PySide6", "fastapi", "uvicorn", "pyqtgraph"},
    "deploy": {"PySide6", "pyqtgraph", "fastapi", "uvicorn", "ray"},
    "ray_app": {"PySide6", "pyqtgraph"},
}


ENGINE = PACKAGE / "engine"
# the engine's wing -> the wings it may import (docs/dev/architecture.md, "The engine's wings")
ENGINE_WINGS = {
    "model": set(),
    "text": set(),
    "batch": set(),
    "sampling": set(),
    "residency": {"model", "batch", "text"},
    "step": {"model", "batch", "sampling", "residency"},
    "loop": {"model", "text", "batch", "sampling", "residency", "step"},
}
# the engine's public face: only these modules, besides the wings, stand at its top; the wings
# import config, sampling_params, settings, errors and outputs, never the facade
# (engine.py, serving_engine.py)
ENGINE_FACE = {"engine", "serving_engine"}
ENGINE_TOP = {"__init__", "config", "sampling_params", "settings", "errors", "outputs", *ENGINE_FACE}


def modules() -> dict[str, list[Path]]:
    found: dict[str, list[Path]] = {}
    for item in sorted(PACKAGE.iterdir()):
        if item.is_dir() and (item / "__init__.py").exists():
            found[item.name] = sorted(item.rglob("*.py"))
        elif item.suffix == ".py" and item.stem not in ("__init__", "__main__", *SHARED):
            found[item.stem] = [item]
    return found


def imported_modules(path: Path) -> list[str]:
    """The dotted modules this file imports (``import X``, ``from X import ...``)."""
    targets: list[str] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            targets.append(node.module)
    return targets


def imported(path: Path) -> set[str]:
    """Top-level names this file imports: 'multilora_studio.X' as 'X', others by their first part."""
    names: set[str] = set()
    for target in imported_modules(path):
        parts = target.split(".")
        names.add(parts[1] if parts[0] == "multilora_studio" and len(parts) > 1 else parts[0])
    return names


def test_every_package_imports_only_what_the_architecture_allows():
    found = modules()
    assert set(ALLOWED) >= set(found), f"packages missing from the table: {set(found) - set(ALLOWED)}"
    problems = []
    for package, files in found.items():
        project = set(ALLOWED) | {"kernels"}
        for path in files:
            names = imported(path)
            for name in sorted(names & project - ALLOWED[package] - {package}):
                problems.append(f"{path.relative_to(ROOT)} imports {name}")
            for name in sorted(names & THIRD_PARTY_FORBIDDEN.get(package, set())):
                problems.append(f"{path.relative_to(ROOT)} imports {name}")
    assert problems == []


def test_the_architecture_doc_states_the_same_allowed_imports():
    """docs/dev/architecture.md's table names, for each package, the project packages it may import:
    the same sets as ALLOWED, so the doc cannot drift from what this test enforces."""
    text = (ROOT / "docs" / "dev" / "architecture.md").read_text()
    project = set(ALLOWED) | {"kernels"}
    documented: dict[str, set[str]] = {}
    for line in text.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) != 3 or not cells[0].startswith("`"):
            continue
        row = {name.rstrip("/").removesuffix(".py") for name in re.findall(r"`([\w./]+)`", cells[0])}
        may = {name.rstrip("/").removesuffix(".py") for name in re.findall(r"`([\w./]+)`", cells[1])}
        for package in row & project:
            documented[package] = may & project - {package}
    assert set(documented) == set(ALLOWED), f"rows missing: {set(ALLOWED) - set(documented)}"
    differ = {
        p: (documented[p], ALLOWED[p] - SHARED) for p in ALLOWED if documented[p] != ALLOWED[p] - SHARED
    }
    assert differ == {}, "doc vs ALLOWED: " + "; ".join(f"{p}: {d} vs {a}" for p, (d, a) in differ.items())


QT = {"PySide6", "shiboken6", "pyqtgraph"}


def project_imports(path: Path) -> set[Path]:
    """The project's files ``path`` imports (each module a ``from X import name`` may mean)."""
    dotted: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            dotted.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            dotted.add(node.module)
            dotted.update(f"{node.module}.{alias.name}" for alias in node.names)
    found = set()
    for name in dotted:
        if name.split(".")[0] != "multilora_studio":
            continue
        base = ROOT.joinpath(*name.split("."))
        for candidate in (base.with_suffix(".py"), base / "__init__.py"):
            if candidate.exists():
                found.add(candidate)
    return found


def test_the_gui_workflow_models_reach_no_qt():
    """gui/workflows/ holds the views' plain models, whose rules are tested without a window: no
    module they import, directly or through others, imports Qt."""
    seen: set[Path] = set()
    todo = sorted((PACKAGE / "gui" / "workflows").rglob("*.py"))
    problems = []
    while todo:
        path = todo.pop()
        if path in seen:
            continue
        seen.add(path)
        problems += [f"{path.relative_to(ROOT)} imports {name}" for name in sorted(imported(path) & QT)]
        todo += sorted(project_imports(path) - seen)
    assert problems == []


def engine_parts(path: Path) -> set[str]:
    """The engine's wings and top modules this file imports ('multilora_studio.engine.X...' as 'X')."""
    parts: set[str] = set()
    for target in imported_modules(path):
        names = target.split(".")
        if names[:2] == ["multilora_studio", "engine"] and len(names) > 2:
            parts.add(names[2])
    return parts


def test_the_engine_top_holds_its_public_face_and_its_wings_only():
    found = {
        item.stem for item in ENGINE.iterdir() if item.suffix == ".py" or (item / "__init__.py").is_file()
    }
    assert found == ENGINE_TOP | set(ENGINE_WINGS)


def test_each_engine_wing_imports_only_the_wings_below_it():
    problems = []
    for wing, allowed in ENGINE_WINGS.items():
        for path in sorted((ENGINE / wing).rglob("*.py")):
            for name in sorted(engine_parts(path) - {wing}):
                if name in ENGINE_FACE or (name in ENGINE_WINGS and name not in allowed):
                    problems.append(f"{path.relative_to(ROOT)} imports engine/{name}")
    assert problems == []


def test_the_architecture_doc_states_the_same_wings():
    """docs/dev/architecture.md's table of the engine's wings names, for each, the wings it may
    import: the same sets as ENGINE_WINGS."""
    text = (ROOT / "docs" / "dev" / "architecture.md").read_text()
    documented: dict[str, set[str]] = {}
    for line in text.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        wing = re.fullmatch(r"`engine/(\w+)/`", cells[0]) if len(cells) == 3 else None
        if wing is not None:
            documented[wing[1]] = set(re.findall(r"`(\w+)/`", cells[1])) & set(ENGINE_WINGS)
    assert documented == ENGINE_WINGS
