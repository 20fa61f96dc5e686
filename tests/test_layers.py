"""The package layering of ``src/dapo``, checked over every import statement (module level and
inside functions alike; only ``if TYPE_CHECKING:`` blocks are left out): a package may import
the packages in lower layers and those in its own layer that the layer's row allows, never a
higher one. So there is no import cycle between packages. docs/architecture.md draws the same
layers; a new package gets a row here and there.
"""

from __future__ import annotations

import ast
import re
from collections import defaultdict
from pathlib import Path

SRC = Path(__file__).resolve().parent.parent / "src" / "dapo"

# top to bottom; packages in one row do not import each other
LAYERS: list[tuple[str, ...]] = [
    ("cli",),
    ("bench",),
    ("trainer",),
    ("run_config",),
    ("viewer", "distributed", "tasks"),
    ("rollout",),
    ("actor", "tools", "sampling"),
    ("data",),
    ("reward",),
    ("model",),
    ("algo",),
    ("checkpoint", "outputs"),
    ("config",),
    ("atomic",),
    ("batch", "errors"),
]
_MODULE_PATH = re.compile(r"dapo(\.[a-z_][a-z0-9_]*)+")
RANK = {pkg: i for i, row in enumerate(LAYERS) for pkg in row}


def _package(module: str) -> str | None:
    parts = module.split(".")
    if parts[0] != "dapo" or len(parts) < 2:
        return None
    return parts[1]


def _is_type_checking(node: ast.If) -> bool:
    return "TYPE_CHECKING" in ast.unparse(node.test)


def _imports(tree: ast.AST):
    """(line, imported module) for every import, skipping TYPE_CHECKING blocks; a string that is
    a whole dotted ``dapo.`` module path counts too (a module imported by name later, as
    ``importlib.import_module`` does)."""
    stack = [tree]
    while stack:
        node = stack.pop()
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child):
                stack.extend(child.orelse)
                continue
            if isinstance(child, ast.ImportFrom) and child.module and child.level == 0:
                if child.module == "dapo":
                    yield from ((child.lineno, f"dapo.{a.name}") for a in child.names)
                else:
                    yield child.lineno, child.module
            elif isinstance(child, ast.Import):
                yield from ((child.lineno, a.name) for a in child.names)
            elif isinstance(child, ast.Constant) and isinstance(child.value, str):
                if _MODULE_PATH.fullmatch(child.value):
                    yield child.lineno, child.value
            stack.append(child)


def import_edges(src: Path = SRC) -> dict[tuple[str, str], list[str]]:
    """(importing package, imported package) -> ["path:line", ...] across packages."""
    edges: dict[tuple[str, str], list[str]] = defaultdict(list)
    for path in sorted(src.rglob("*.py")):
        rel = path.relative_to(src.parent)
        module = ".".join(rel.with_suffix("").parts)
        me = _package(module if not module.endswith("__init__") else module + ".x")
        for line, target in _imports(ast.parse(path.read_text(), str(path))):
            them = _package(target)
            if me and them and me != them:
                edges[(me, them)].append(f"{rel}:{line}")
    return edges


def test_every_package_has_a_layer():
    packages = {p.stem if p.is_file() else p.name for p in SRC.iterdir()}
    packages = {p for p in packages if not p.startswith(("_", ".")) and p != "py"}
    unplaced = sorted(p for p in packages if p not in RANK)
    assert not unplaced, f"packages without a layer in tests/test_layers.py: {unplaced}"


def test_no_package_imports_upward_or_sideways():
    bad = []
    for (me, them), where in sorted(import_edges().items()):
        if me in RANK and them in RANK and RANK[them] <= RANK[me]:
            bad.append(f"{me} -> {them} ({', '.join(where[:3])}{' ...' if len(where) > 3 else ''})")
    assert not bad, "imports against the layering:\n  " + "\n  ".join(bad)


def test_the_checker_sees_deferred_and_aliased_imports(tmp_path):
    pkg = tmp_path / "dapo"
    (pkg / "config").mkdir(parents=True)
    (pkg / "config" / "x.py").write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from dapo.trainer import loop\n"
        "def f():\n    from dapo import tasks\n    import dapo.model.loader as m\n"
        "RULES = ('dapo.reward.factory',)\nNOTE = 'see dapo.algo for the names'\n"
    )
    edges = import_edges(pkg)
    assert set(edges) == {("config", "tasks"), ("config", "model"), ("config", "reward")}
    assert edges[("config", "tasks")] == ["dapo/config/x.py:5"]
