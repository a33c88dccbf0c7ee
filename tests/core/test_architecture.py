"""The layers of ARCHITECTURE.md, enforced: what each part of ``tarproc`` may import.

Every ``import`` in ``tarproc/`` is read with ``ast`` (those inside functions too: a lazy import is
still a dependency) and checked against the layer table below, which ARCHITECTURE.md shows to
people. A module may import its own layer and the layers under it, never one above; click, aiohttp
and torch each stay in the part that faces them; no module imports another module's private name.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "tarproc"

# lowest first; a module belongs to the first entry that is a prefix of its dotted name
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("base", ("errors", "compression", "sniff", "fieldspec", "procgroup", "handoff", "_speedups", "_jpeg")),
    ("tar", ("tar", "tario")),
    ("io", ("sources", "sinks")),
    ("records", ("samples", "stages", "foreign_index", "shard_index", "index", "shards", "sort", "process", "pcat", "first", "tables", "classnames")),
    ("media", ("media_headers", "content", "imaging", "decode", "show", "relayout")),
    ("consumers", ("dataset", "transport", "jobs", "view")),
    ("front", ("cli", "demo", "__init__")),
]

# third-party packages that only one part may import (lazily or not)
CONFINED = {
    "click": ("cli",),
    "aiohttp": ("view",),
    "torch": ("dataset", "transport"),
    "nvidia": ("decode",),
    "dask": ("jobs",),
}

# names a module may take from the package's top (`from .. import __version__`)
TOP_LEVEL_CONSTANTS = {"__version__"}


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE).with_suffix("").parts
    return ".".join(parts)  # "tar.reader", "cli.tarcat", "__init__", "dataset.__init__"


def _layer(name: str) -> int:
    for i, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            if name == prefix or name.startswith(prefix + "."):
                return i
    raise AssertionError(f"tarproc.{name} is in no layer: add it to LAYERS here and to ARCHITECTURE.md")


def _imports(path: Path) -> list[tuple[int, str, list[str]]]:
    """(line, absolute module imported, names taken from it) for every import in the file."""
    name = _module_name(path)
    package = name.split(".")[:-1]  # "tar.reader" -> ["tar"]; "tar.__init__" -> ["tar"]
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name, []) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            names = [alias.name for alias in node.names]
            if node.level:
                base = package[: len(package) - node.level + 1]
                target = ".".join(["tarproc", *base, *([node.module] if node.module else [])])
            else:
                target = node.module or ""
            found.append((node.lineno, target, names))
    return found


def _sources() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts)


def _is_module(dotted: str) -> bool:
    relative = dotted.split(".")[1:]
    if not relative:
        return False
    path = PACKAGE.joinpath(*relative)
    # a Python module, a package, or a C extension (its source sits beside it, built or not)
    return path.with_suffix(".py").exists() or (path / "__init__.py").exists() or path.with_suffix(".c").exists()


def _internal_target(target: str, names: list[str]) -> list[str]:
    """The tarproc modules an import depends on: `from . import x` depends on the module x."""
    if target == "tarproc" or target.startswith("tarproc."):
        modules = [f"{target}.{n}" for n in names if _is_module(f"{target}.{n}")]
        rest = [n for n in names if not _is_module(f"{target}.{n}")]
        if rest and not (target == "tarproc" and set(rest) <= TOP_LEVEL_CONSTANTS):
            modules.append(target)
        return [m.split(".", 1)[1] if "." in m else "__init__" for m in modules]
    return []


def test_the_layer_table_covers_every_module():
    for path in _sources():
        _layer(_module_name(path))


def test_no_module_imports_a_layer_above_its_own():
    wrong = []
    for path in _sources():
        name = _module_name(path)
        mine = _layer(name)
        for line, target, names in _imports(path):
            for dep in _internal_target(target, names):
                if _layer(dep) > mine:
                    wrong.append(f"tarproc/{path.relative_to(PACKAGE)}:{line}: {LAYERS[mine][0]} layer imports "
                                 f"tarproc.{dep} ({LAYERS[_layer(dep)][0]} layer)")
    assert not wrong, "imports against the layers of ARCHITECTURE.md:\n" + "\n".join(wrong)


@pytest.mark.parametrize("package", sorted(CONFINED))
def test_third_party_frameworks_stay_in_their_part(package):
    allowed = CONFINED[package]
    wrong = []
    for path in _sources():
        name = _module_name(path)
        if any(name == a or name.startswith(a + ".") for a in allowed):
            continue
        for line, target, _ in _imports(path):
            if target == package or target.startswith(package + "."):
                wrong.append(f"tarproc/{path.relative_to(PACKAGE)}:{line}: imports {target}")
    assert not wrong, f"{package} belongs in {', '.join(allowed)} only:\n" + "\n".join(wrong)


def test_no_module_imports_another_modules_private_names():
    wrong = []
    for path in _sources():
        for line, target, names in _imports(path):
            if not target.startswith("tarproc"):
                continue
            for n in names:
                if not n.startswith("_") or n in TOP_LEVEL_CONSTANTS:
                    continue
                if _is_module(f"{target}.{n}"):
                    continue  # a module (the C extensions are named _speedups, _jpeg)
                if target.split(".")[-1] in ("_speedups", "_jpeg"):
                    continue  # an extension's functions are its public names
                wrong.append(f"tarproc/{path.relative_to(PACKAGE)}:{line}: takes {n} from {target}")
    assert not wrong, "private names imported across modules (make them public or move them):\n" + "\n".join(wrong)


def test_the_table_here_is_the_table_in_architecture_md():
    text = (PACKAGE.parent / "ARCHITECTURE.md").read_text()
    for layer, prefixes in LAYERS:
        row = next((r for r in text.splitlines() if r.startswith(f"| {layer} ")), None)
        assert row, f"ARCHITECTURE.md has no row for the {layer} layer"
        for prefix in prefixes:
            if prefix != "__init__":
                assert prefix in row, f"ARCHITECTURE.md's {layer} row does not name {prefix}"
