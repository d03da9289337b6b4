"""The house's rules, checked from the source text (nothing is imported or run).

* No import circles between the project's modules (every ``import`` counts, also the ones inside
  functions: a lazy import still ties two modules together).
* The inference package ``sglang_hsd`` never imports the training package ``eagle_heads``
  (``eagle_heads`` builds on ``sglang_hsd``, not the other way round).
* Size aims: package modules under ``MAX_MODULE_LINES`` lines, functions under
  ``MAX_FUNCTION_LINES`` lines besides their docstring (Triton kernels excepted: one program is
  one function; the few others are listed in ``LONG_FUNCTIONS`` with the reason).

Run alone: ``python -m pytest tests/test_structure.py``.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("sglang_hsd", "eagle_heads")
MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 60
# Functions allowed past the aim, with the reason. Keep this list short and the reasons true.
LONG_FUNCTIONS = {
    ("eagle_heads.exit_heads", "train_exit_heads"): "one training loop with resume and checkpointing: "
    "splitting it would reorder random draws and checkpoint writes that saved runs depend on",
    ("eagle_heads.eagle3_train", "train_eagle3"): "same as train_exit_heads",
}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _sources() -> dict[str, Path]:
    return {_module_name(p): p for pkg in PACKAGES for p in sorted((ROOT / pkg).rglob("*.py"))}


def _resolve(module: str, path: Path, node: ast.ImportFrom) -> str:
    """Absolute name of the module an ``ImportFrom`` reads (relative imports resolved)."""
    if not node.level:
        return node.module or ""
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    base = package[: len(package) - node.level + 1]
    return ".".join(base + ([node.module] if node.module else []))


def _imports(module: str, path: Path, known: set[str]) -> set[str]:
    """Project modules ``module`` imports, at any depth of its code, including
    ``importlib.import_module("...")`` calls with a literal name."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = _resolve(module, path, node)
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)
        elif (isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", ""))
              == "import_module" and node.args and isinstance(node.args[0], ast.Constant)):
            names.add(str(node.args[0].value))
    found = set()
    for name in names:
        # "a.b.c" where only "a.b" is a module (c is a function): keep the longest known prefix.
        parts = name.split(".")
        for end in range(len(parts), 0, -1):
            candidate = ".".join(parts[:end])
            if candidate in known:
                found.add(candidate)
                break
    found.discard(module)
    return found


def import_graph() -> dict[str, set[str]]:
    sources = _sources()
    known = set(sources)
    return {name: _imports(name, path, known) for name, path in sources.items()}


def _is_ancestor_package(a: str, b: str) -> bool:
    return b.startswith(a + ".")


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan). A package's
    ``__init__`` importing its own submodules is not a circle of files: edges from a package to
    its submodules are left out."""
    edges = {m: {d for d in deps if not _is_ancestor_package(m, d)} for m, deps in graph.items()}
    index, low, stack, on_stack, out = {}, {}, [], set(), []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for dep in edges[node]:
            if dep not in index:
                visit(dep)
                low[node] = min(low[node], low[dep])
            elif dep in on_stack:
                low[node] = min(low[node], index[dep])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return out


def test_graph_sees_known_edges():
    """The walker must see real imports, or the circle check below could never fail."""
    graph = import_graph()
    assert "sglang_hsd.sampling" in graph["sglang_hsd.runtime.engine"]
    assert any(dep.startswith("sglang_hsd") for dep in graph["eagle_heads.pipeline"])


def test_cycle_finder_detects_a_circle():
    assert import_cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert import_cycles({"p": {"p.x"}, "p.x": {"p"}}) == []


def test_no_import_circles():
    assert import_cycles(import_graph()) == []


def _named_modules(path: Path, known: set[str]) -> set[str]:
    """Project module names spelled as string constants (dynamic imports by a name in a table)."""
    return {node.value for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in known}


def test_inference_package_does_not_import_training_package():
    sources = _sources()
    graph = import_graph()
    offenders = {}
    for module, path in sources.items():
        if module.split(".")[0] != "sglang_hsd":
            continue
        deps = graph[module] | _named_modules(path, set(sources))
        training = sorted(d for d in deps if d.split(".")[0] == "eagle_heads")
        if training:
            offenders[module] = training
    assert offenders == {}


def _is_kernel(node: ast.FunctionDef) -> bool:
    return any("jit" in ast.unparse(d) for d in node.decorator_list)


def _body_lines(node: ast.FunctionDef) -> int:
    """Lines of a function without its docstring (docstrings that state shapes are wanted)."""
    lines = node.end_lineno - node.lineno + 1
    first = node.body[0]
    if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
        lines -= first.end_lineno - first.lineno + 1
    return lines


@pytest.mark.parametrize("module", sorted(_sources()))
def test_sizes(module):
    path = _sources()[module]
    source = path.read_text()
    assert len(source.splitlines()) <= MAX_MODULE_LINES, f"{path}: split the module"
    long = [f"{node.name} ({_body_lines(node)} lines without the docstring)"
            for node in ast.walk(ast.parse(source))
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and not _is_kernel(node)
            and (module, node.name) not in LONG_FUNCTIONS
            and _body_lines(node) > MAX_FUNCTION_LINES]
    assert long == [], f"{path}: {long}"


def test_long_function_exceptions_are_still_needed():
    """An exception whose function shrank (or moved) must leave ``LONG_FUNCTIONS``."""
    sources = _sources()
    stale = []
    for module, name in LONG_FUNCTIONS:
        tree = ast.parse(sources[module].read_text()) if module in sources else ast.Module(body=[])
        nodes = [node for node in ast.walk(tree)
                 if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == name]
        if not nodes or max(map(_body_lines, nodes)) <= MAX_FUNCTION_LINES:
            stale.append((module, name))
    assert stale == []
