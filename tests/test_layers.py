"""The house plan: autoopt's stages import one way, from later stages to earlier ones, with no cycles.

``LAYERS`` is the one place the allowed order is written (ARCHITECTURE.md draws it). Read top to
bottom it is the data flow backwards: a module may import from its own stage and any stage below it,
never from one above. Stages on one line (``a | b``) are independent: neither imports the other.
Every import counts, lazy ones inside functions and ``TYPE_CHECKING`` ones included, because a lazy
import still ties two stages together.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

#: later stages first. A new sub-package gets a line here before it lands.
LAYERS: tuple[str, ...] = (
    "autoopt.__main__",
    "autoopt.cli",
    "autoopt",                                         # the package root: the lazy public API
    "autoopt.api | autoopt.report",
    "autoopt.regret",                                  # measured regret of recommend()'s choices (cli only)
    "autoopt.nn",                                      # torch-facing ops (custom ops over the backend kernels)
    "autoopt.fleet",                                  # evaluations over every GPU (worker processes)
    "autoopt.tuning | autoopt.trace",                 # trace: profiler traces summarized and compared
    "autoopt.validation",                              # predicted vs measured whole models (cli only)
    "autoopt.planning | autoopt.backend",
    "autoopt.runtimes | autoopt.search",              # serving runtimes' rules (read by planning)
    "autoopt.templates",                               # the built-in plugin, loaded by name by plugins
    "autoopt.plugins | autoopt.results",
    "autoopt.kernels",
    "autoopt.hardware",
    "autoopt._files | autoopt._hash | autoopt._lazy | autoopt._log | autoopt._paths | autoopt._serde | "
    "autoopt.errors",
)


def _source_files() -> dict[str, Path]:
    """Module name -> file, with ``templates/`` installed as ``autoopt.templates`` (pyproject's package-dir)."""
    out: dict[str, Path] = {}
    for base, package in ((ROOT / "autoopt", "autoopt"), (ROOT / "templates", "autoopt.templates")):
        for path in base.rglob("*.py"):
            parts = [package, *path.relative_to(base).with_suffix("").parts]
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = path
    return out


MODULES = _source_files()


def _is_package(module: str) -> bool:
    return MODULES[module].name == "__init__.py"


def _closest_module(name: str) -> str | None:
    """The most specific known module that ``name`` (a module or a name inside one) refers to."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def imports_of(module: str) -> Iterator[tuple[str, int]]:
    """(imported autoopt module, line) for every import in ``module``, relative ones resolved."""
    tree = ast.parse(MODULES[module].read_text(), filename=str(MODULES[module]))
    package = module if _is_package(module) else module.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            # `from pkg import sub` imports the submodule when there is one
            names = [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in node.names]
        else:
            continue
        for name in names:
            target = _closest_module(name) if name.startswith("autoopt") else None
            if target is not None and target != module:
                yield target, node.lineno


def _layer_table() -> list[tuple[str, ...]]:
    return [tuple(part.strip() for part in line.split("|")) for line in LAYERS]


def stage_of(module: str) -> tuple[int, str]:
    """(depth, stage) of ``module``: depth 0 is the top layer; the stage is the longest declared prefix."""
    best: tuple[int, str] | None = None
    for depth, stages in enumerate(_layer_table()):
        for stage in stages:
            if (module == stage or module.startswith(stage + ".")) and (best is None or len(stage) > len(best[1])):
                best = (depth, stage)
    if best is None:
        raise AssertionError(f"{module} belongs to no layer: add its stage to LAYERS in {__file__}")
    return best


def test_every_module_belongs_to_a_declared_stage():
    assert {m: stage_of(m)[1] for m in MODULES}  # stage_of raises, naming the module, when one is missing


def test_no_module_imports_from_a_later_stage_or_an_independent_sibling():
    wrong = []
    for module in sorted(MODULES):
        depth, stage = stage_of(module)
        for target, line in imports_of(module):
            t_depth, t_stage = stage_of(target)
            if t_depth < depth or (t_depth == depth and t_stage != stage):
                wrong.append(f"{MODULES[module].relative_to(ROOT)}:{line} ({stage}) imports {target} ({t_stage})")
    assert not wrong, "imports against the layer order:\n" + "\n".join(wrong)


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
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
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_cycles_lazy_or_not():
    graph = {m: {t for t, _ in imports_of(m)} for m in MODULES}
    assert _cycles(graph) == []


def test_cycle_finder_reports_a_two_module_cycle():
    assert _cycles({"a": {"b"}, "b": {"a"}, "c": {"a"}}) == [["a", "b"]]


@pytest.mark.parametrize("module, target", [
    ("autoopt.hardware.profile", "autoopt.errors"),
    ("autoopt.search.ranking", "autoopt.plugins.manager"),
    ("autoopt.planning.recommendation", "autoopt.search.ranking"),
])
def test_known_downward_imports_are_seen(module, target):
    assert target in {t for t, _ in imports_of(module)}
