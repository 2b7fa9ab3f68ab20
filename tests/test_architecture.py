"""The package's architecture: one subpackage per part of the book, dependencies one way.

A part may import from earlier parts and from the shared helpers at the top of
``llmbook`` (``nbtools``, ``validation``, ``environment``, ``paths``), never from a later part, and no
module may take part in an import cycle. The reader's commands at the top of ``llmbook``
(``python -m llmbook.chat``, the ``llmbook`` console script) sit after every part: they may import any part, and nothing
in the package may import them. Every ``import`` statement counts, including
those inside functions and under ``if TYPE_CHECKING:``: a lazy import is still a
dependency.
"""

from __future__ import annotations

import ast
import importlib
import pkgutil
from pathlib import Path

import pytest

import llmbook

#: The parts in book order; a module may import only from its own part or earlier ones.
PARTS = ["text", "transformer", "training", "inference", "alignment", "scale"]
HELPERS = {"llmbook", "llmbook.nbtools", "llmbook.validation", "llmbook.environment",
           "llmbook.paths"}
#: Commands a reader runs (``python -m llmbook.chat``): they rank after every part.
COMMANDS = {"llmbook.chat", "llmbook.cli"}
#: The reader's tools (issue 28's workbench: stubs, checks, grader): they rank with the commands,
#: since a chapter's checks may import any part, and no part may import them.
TOOLS = {"workbench"}
ROOT = Path(llmbook.__file__).resolve().parent


def all_modules() -> list[str]:
    names = ["llmbook"]
    names += [m.name for m in pkgutil.walk_packages([str(ROOT)], prefix="llmbook.")]
    return sorted(names)


def source_path(module: str) -> Path:
    rel = Path(*module.split(".")[1:])
    package = ROOT / rel / "__init__.py"
    return package if package.is_file() else (ROOT / rel).with_suffix(".py")


def rank(module: str) -> int:
    """0 for the shared helpers, then 1 + the index of the module's part."""
    if module in HELPERS:
        return 0
    if module in COMMANDS or module.split(".")[1] in TOOLS:
        return len(PARTS) + 1
    part = module.split(".")[1]
    if part not in PARTS:
        raise AssertionError(f"{module} lies outside the parts {PARTS} and is not a shared "
                             f"helper {sorted(HELPERS)}: move it into the part that builds it")
    return 1 + PARTS.index(part)


def imports_of(module: str, source: str) -> set[str]:
    """The ``llmbook`` modules that ``source`` (the text of ``module``) imports."""
    known = set(all_modules())
    is_package = source_path(module).name == "__init__.py" if module in known else False
    package = module if is_package else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative import: resolve against this module's package
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parent + ([base] if base else []))
            # `from pkg import name` imports the submodule pkg.name when there is one
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base
                       for a in node.names]
        else:
            continue
        for target in targets:
            while target and target not in known:  # `import llmbook.a.b.func` -> module
                target = target.rpartition(".")[0]
            if target.startswith("llmbook") and target != module:
                found.add(target)
    return found


def graph() -> dict[str, set[str]]:
    return {m: imports_of(m, source_path(m).read_text()) for m in all_modules()}


def direction_violations(edges: dict[str, set[str]]) -> list[str]:
    """Every import of a module from a later part (the helpers rank before every part)."""
    return sorted(f"{module} imports {target} (a later part)"
                  for module, targets in edges.items() for target in targets
                  if rank(target) > rank(module))


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges.get(v, ())):
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

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


@pytest.mark.parametrize("module", all_modules())
def test_every_module_imports(module):
    importlib.import_module(module)


def test_every_module_lives_in_a_part_or_is_a_shared_helper():
    for module in all_modules():
        rank(module)  # raises for a module outside the parts
    top = {p.stem for p in ROOT.glob("*.py")} - {"__init__"}
    assert {f"llmbook.{m}" for m in top} <= HELPERS | COMMANDS, \
        f"stray top-level modules: {sorted(top)}"


def test_dependencies_point_back_to_earlier_parts_only():
    assert direction_violations(graph()) == []


def test_there_is_no_import_cycle():
    assert cycles(graph()) == []


def test_the_checks_catch_a_wrong_import_and_a_cycle():
    """The two rules above on a deliberately wrong package: they must fail."""
    edges = graph()
    edges["llmbook.transformer.model"] = edges["llmbook.transformer.model"] | imports_of(
        "llmbook.transformer.model", "from llmbook.inference.sampling import generate\n")
    assert direction_violations(edges) == [
        "llmbook.transformer.model imports llmbook.inference.sampling (a later part)"]
    # ... which also closes a cycle, since sampling imports the model (perhaps through
    # other inference modules, which then belong to the same cycle)
    found = cycles(edges)
    assert len(found) == 1
    assert {"llmbook.inference.sampling", "llmbook.transformer.model"} <= set(found[0])
    assert all(m.startswith(("llmbook.inference.", "llmbook.transformer.")) for m in found[0])
    # the circle this package once had: model <-> hf_loading, within one part
    edges = graph()
    edges["llmbook.transformer.model"] = edges["llmbook.transformer.model"] | {
        "llmbook.transformer.hf_loading"}
    assert direction_violations(edges) == []
    assert cycles(edges) == [["llmbook.transformer.hf_loading", "llmbook.transformer.model"]]
    # helpers may not depend on a part
    assert direction_violations({"llmbook.nbtools": {"llmbook.text.corpus"}}) == [
        "llmbook.nbtools imports llmbook.text.corpus (a later part)"]
    # a command may import any part, and no part may import a command
    assert direction_violations({"llmbook.chat": {"llmbook.scale.moe"}}) == []
    assert direction_violations({"llmbook.scale.moe": {"llmbook.chat"}}) == [
        "llmbook.scale.moe imports llmbook.chat (a later part)"]


def test_imports_are_resolved_like_python_resolves_them():
    found = imports_of("llmbook.inference.flash", "def f():\n"
                       "    from llmbook.inference import flash_triton\n"
                       "    import llmbook.transformer.model\n"
                       "    from . import quant\n"
                       "    from ..text.tokenizer import BPETokenizer\n")
    assert found == {"llmbook.inference.flash_triton", "llmbook.transformer.model",
                     "llmbook.inference.quant", "llmbook.text.tokenizer"}


def test_every_part_opens_with_a_map_of_its_chapters():
    for part in PARTS:
        init = ROOT / part / "__init__.py"
        if not init.exists():
            continue  # a part of the book not yet written
        doc = ast.get_docstring(ast.parse(init.read_text())) or ""
        assert "Chapter" in doc or "chapter" in doc, f"{init} has no chapter map"
        modules = {p.stem for p in (ROOT / part).glob("*.py")} - {"__init__"}
        modules |= {p.name for p in (ROOT / part).iterdir() if (p / "__init__.py").is_file()}
        missing = [m for m in sorted(modules) if m not in doc]
        assert not missing, f"{init}'s map does not mention {missing}"


def test_the_readme_layout_names_every_part_and_helper():
    readme = (ROOT.parent / "README.md").read_text()
    layout = readme[readme.index("## Layout"):readme.index("## Working on the book")]
    for entry in sorted(p.name for p in ROOT.iterdir() if not p.name.startswith("__")):
        name = entry if entry.endswith(".py") else f"{entry}/"
        assert name in layout, f"README's layout section does not show llmbook/{name}"
