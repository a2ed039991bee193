"""The shape of the tree (docs/architecture.md, "The dependency rule"): no import circle among the modules of
weirflow and its plugin packages, and no source file over 600 lines. The import layers themselves are
import-linter contracts (`.importlinter`, `make lint`); a circle passes every layer contract drawn inside one
package, so it is checked here, over the whole graph grimp reads (imports under ``TYPE_CHECKING`` count: a
circle of types is still two modules that cannot be read apart)."""

from __future__ import annotations

import tomllib
from pathlib import Path

import grimp

ROOT = Path(__file__).resolve().parents[2]
# Every package folder and the name it installs under, as pyproject.toml's package-dir says (the plugins), plus
# core: a plugin added there is checked without a change here.
PACKAGE_DIRS = {
    "weirflow": "weirflow",
    **tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"],
}
PACKAGES = sorted(PACKAGE_DIRS)  # the Azure suite's portions of its namespace each a root, as in .importlinter
SOURCE_DIRS = sorted(set(PACKAGE_DIRS.values()))
MAX_LINES = 600


def _circles(graph: grimp.ImportGraph) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for root in sorted(graph.modules):
        if root in index:
            continue
        work = [(root, iter(sorted(graph.find_modules_directly_imported_by(root))))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.find_modules_directly_imported_by(child)))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_no_module_imports_itself_back_through_others() -> None:
    graph = grimp.build_graph(*PACKAGES, cache_dir=None)
    circles = _circles(graph)
    assert not circles, "import circles (break each: docs/architecture.md, 'The dependency rule'):\n" + "\n".join(
        " -> ".join(circle) for circle in circles
    )


def test_the_circle_finder_finds_a_circle() -> None:
    graph = grimp.ImportGraph()
    for module in ("a", "b", "c", "d"):
        graph.add_module(module)
    graph.add_import(importer="a", imported="b")
    graph.add_import(importer="b", imported="c")
    graph.add_import(importer="c", imported="a")
    graph.add_import(importer="c", imported="d")
    assert _circles(graph) == [["a", "b", "c"]]


def test_no_source_file_is_over_600_lines() -> None:
    over = {}
    for folder in SOURCE_DIRS:
        for path in sorted((ROOT / folder).rglob("*.py")):
            lines = len(path.read_text(encoding="utf-8").splitlines())
            if lines > MAX_LINES:
                over[path.relative_to(ROOT).as_posix()] = lines
    assert not over, f"files over {MAX_LINES} lines (split them by what they hold): {over}"


def test_a_public_helper_loads_no_core_code_with_the_package() -> None:
    """A plugin imports `weirflow.base.clock` or `weirflow.base.errors`; the package's own pipeline API comes
    only when
    asked for (`from weirflow import App`)."""
    import subprocess
    import sys

    probe = (
        "import sys, weirflow.base.clock, weirflow.base.errors; "
        "print(sorted(m for m in sys.modules if m.startswith(('weirflow.pipeline', 'pyspark')))); "
        "from weirflow import App, Stream; print(App.__module__, Stream.__module__)"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout.split(
        "\n"
    )
    assert out[0] == "[]", out[0]
    assert out[1] == "weirflow.pipeline.api weirflow.pipeline.api"
