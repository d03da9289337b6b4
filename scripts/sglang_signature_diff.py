"""Compare the SGLang signatures the plugin pins with another SGLang source tree.

``sglang_hsd/sglang_plugin/signatures.py`` pins the parameter list of every SGLang symbol the
plugin subclasses, wraps or replaces (``EXPECTED_SIGNATURES``, written the way
``inspect.signature`` prints them, without annotations). This script reads another SGLang tree
*without importing it*: it finds each pinned symbol by parsing the module's source with ``ast``,
renders its parameters in ``inspect.signature``'s format and compares them with the pin.

Usage::

    python scripts/sglang_signature_diff.py SOURCE [--rev REV]

SOURCE is a folder that contains the ``sglang`` package (a ``site-packages`` folder, the
``python/`` folder of a checkout, or the checkout itself), or a git directory of the SGLang
repository (bare or not; files are read with ``git show REV:python/sglang/...``, REV defaults to
``HEAD``). One line per symbol: ``OK``, ``CHANGED`` (pinned and found signature and a short
parameter diff follow) or ``MISSING`` (with the reason), then a summary. Exit status 1 when
anything changed or is missing, 2 on a usage error.

How a symbol is found (the way Python would look it up at run time):

* the module is the longest prefix of the dotted path with a file ``a/b/c.py`` or
  ``a/b/c/__init__.py``; the rest is a chain of names (``Class.method``, ``Outer.Inner.method``);
* a name is its last binding in the module or class body (``if``/``try``/``with`` blocks
  included, ``if TYPE_CHECKING:`` blocks left out); a ``from sglang... import x`` or an ``x = y``
  binding is followed (noted as "re-exported from ..." / "assigned from ...");
* a method missing from a class body is looked up in the class's bases that live in sglang
  (noted as "inherited from ...");
* ``@classmethod`` methods lose their first parameter (``inspect.signature`` of a class's
  classmethod is that of a bound method); a pinned class renders its ``__init__`` without ``self``.
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SIGNATURES_FILE = ROOT / "sglang_hsd" / "sglang_plugin" / "signatures.py"
MAX_HOPS = 4  # re-exports / assignments / base classes followed per symbol before giving up
DefNode = ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef


# --- Source trees ---------------------------------------------------------------------------


class FolderTree:
    """An SGLang tree on disk: ``root`` holds the ``sglang`` package folder."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def describe(self) -> str:
        """One line naming the tree."""
        return f"folder {self.root}"

    def read(self, relpath: str) -> str | None:
        """Text of ``relpath`` (``sglang/...``), or None when there is no such file."""
        path = self.root / relpath
        return path.read_text(encoding="utf-8") if path.is_file() else None

    def is_dir(self, relpath: str) -> bool:
        """Whether ``relpath`` (``sglang/...``) is a folder (a package, maybe a namespace one)."""
        return (self.root / relpath).is_dir()


class GitTree:
    """An SGLang repository read through git: files under ``python/`` at revision ``rev``."""

    def __init__(self, git_dir: Path, rev: str = "HEAD") -> None:
        self.git_dir, self.rev = git_dir, rev
        listing = self._git("ls-tree", "-r", "--name-only", rev, "--", "python/sglang")
        self.files = {name.removeprefix("python/") for name in listing.splitlines()}
        self.dirs = {str(parent) for name in self.files for parent in Path(name).parents}

    def _git(self, *args: str) -> str:
        return subprocess.run(["git", f"--git-dir={self.git_dir}", *args], check=True,
                              capture_output=True, text=True).stdout

    def describe(self) -> str:
        """One line naming the repository, the commit and its commit date."""
        commit = self._git("rev-parse", f"{self.rev}^{{commit}}").strip()
        date = self._git("log", "-1", "--format=%cI", commit).strip()
        return f"git {self.git_dir} rev {self.rev} = commit {commit} (committed {date})"

    def read(self, relpath: str) -> str | None:
        """Text of ``relpath`` (``sglang/...``) at the revision, or None when absent."""
        if relpath not in self.files:
            return None
        return self._git("show", f"{self.rev}:python/{relpath}")

    def is_dir(self, relpath: str) -> bool:
        """Whether ``relpath`` (``sglang/...``) is a folder (a package, maybe a namespace one)."""
        return relpath in self.dirs


Tree = FolderTree | GitTree


def open_tree(source: Path, rev: str = "HEAD") -> Tree:
    """A ``FolderTree`` when ``source`` (or ``source/python``) holds ``sglang/``, else a
    ``GitTree`` when ``source`` is a git directory; ``ValueError`` otherwise."""
    for root in (source, source / "python"):
        if (root / "sglang" / "__init__.py").is_file():
            return FolderTree(root)
    probe = subprocess.run(["git", f"--git-dir={source}", "rev-parse", "--verify", "--quiet",
                            f"{rev}^{{commit}}"], capture_output=True, text=True)
    if probe.returncode == 0:
        return GitTree(source, rev)
    raise ValueError(f"{source} holds no sglang package and is no git directory with {rev}")


# --- Finding a symbol -----------------------------------------------------------------------


class Missing(Exception):
    """The symbol cannot be found; the message says why."""


@dataclass
class Found:
    """A definition found for a pinned path: the node, its module, how it was reached."""

    node: DefNode
    module: str
    in_class: bool  # reached as an attribute of a class (so @classmethod binds its first param)
    notes: list[str] = field(default_factory=list)


def _is_type_checking(test: ast.expr) -> bool:
    return ast.unparse(test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING")


def _bound_names(stmt: ast.stmt) -> list[str]:
    """Names a (non-block) statement binds."""
    if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return [stmt.name]
    if isinstance(stmt, (ast.Import, ast.ImportFrom)):
        return [a.asname or a.name.split(".")[0] for a in stmt.names]
    targets = stmt.targets if isinstance(stmt, ast.Assign) else (
        [stmt.target] if isinstance(stmt, ast.AnnAssign) and stmt.value is not None else [])
    return [n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)]


def _blocks(stmt: ast.stmt) -> list[list[ast.stmt]]:
    """Statement lists nested in a block statement that run in the same scope."""
    if isinstance(stmt, ast.If):
        return [] if _is_type_checking(stmt.test) else [stmt.body, stmt.orelse]
    if isinstance(stmt, ast.Try):
        return [stmt.body, *(h.body for h in stmt.handlers), stmt.orelse, stmt.finalbody]
    if isinstance(stmt, ast.With):
        return [stmt.body]
    return []


def bindings(body: list[ast.stmt], name: str) -> list[ast.stmt]:
    """The statements in ``body`` (nested blocks included) that bind ``name``, in order."""
    found: list[ast.stmt] = []
    for stmt in body:
        for block in _blocks(stmt):
            found += bindings(block, name)
        if name in _bound_names(stmt):
            found.append(stmt)
    return found


def last_binding(body: list[ast.stmt], name: str) -> ast.stmt | None:
    """The last statement in ``body`` (nested blocks included) that binds ``name``."""
    found = bindings(body, name)
    return found[-1] if found else None


def _rebuilt_from(stmt: ast.stmt, body: list[ast.stmt], name: str) -> DefNode | None:
    """For ``X = wrap(X)``-style rebinding (the value mentions ``X``): the def/class statement
    of ``X`` before it, whose signature the rebuilt object keeps (``__wrapped__``, copied
    namespace); None for any other statement."""
    value = getattr(stmt, "value", None)
    if value is None or not any(isinstance(n, ast.Name) and n.id == name for n in ast.walk(value)):
        return None
    earlier = bindings(body, name)
    earlier = earlier[: earlier.index(stmt)] if stmt in earlier else []
    defs = [s for s in earlier
            if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))]
    return defs[-1] if defs else None


class Resolver:
    """Finds pinned dotted paths in a tree by parsing its modules (each parsed once)."""

    def __init__(self, tree: Tree) -> None:
        self.tree = tree
        self._modules: dict[str, tuple[ast.Module, bool] | None] = {}

    def module(self, name: str) -> tuple[ast.Module, bool] | None:
        """(parsed module, is a package) for a dotted module name, or None when absent. A
        folder without ``__init__.py`` is a namespace package: an empty module."""
        if name not in self._modules:
            base = name.replace(".", "/")
            parsed = None
            for relpath, is_package in ((f"{base}.py", False), (f"{base}/__init__.py", True)):
                text = self.tree.read(relpath)
                if text is not None:
                    parsed = (ast.parse(text, filename=relpath), is_package)
                    break
            if parsed is None and self.tree.is_dir(base):
                parsed = (ast.Module(body=[], type_ignores=[]), True)
            self._modules[name] = parsed
        return self._modules[name]

    def resolve(self, path: str) -> Found:
        """The definition ``path`` names; ``Missing`` when there is none."""
        parts = path.split(".")
        for split in range(len(parts) - 1, 0, -1):  # the longest prefix that is a module
            module, rest = ".".join(parts[:split]), parts[split:]
            parsed = self.module(module)
            if parsed is None:
                continue
            if len(rest) > 1 and last_binding(parsed[0].body, rest[0]) is None:
                raise Missing(f"no module {module}.{rest[0]} and no name {rest[0]} in {module}")
            return self._walk(module, rest)
        raise Missing(f"no module file for any prefix of {path}")

    def _walk(self, module: str, names: list[str]) -> Found:
        notes: list[str] = []
        found = self.lookup(module, names[0], notes, MAX_HOPS)
        for name in names[1:]:
            if not isinstance(found.node, ast.ClassDef):
                raise Missing(f"{found.node.name} in {found.module} is not a class, "
                              f"so it has no {name}")
            found = self.member(found, name, notes, MAX_HOPS)
        found.notes = notes
        return found

    def lookup(self, module: str, name: str, notes: list[str], hops: int) -> Found:
        """Module-level ``name`` in ``module``, following re-exports and ``x = y``."""
        parsed = self.module(module)
        if parsed is None:
            raise Missing(f"module {module} does not exist")
        stmt = last_binding(parsed[0].body, name)
        if stmt is None:
            raise Missing(f"{name} is not defined in {module}")
        return self._follow(stmt, parsed[0].body, module, name, notes, hops, scope=None)

    def _follow(self, stmt: ast.stmt, body: list[ast.stmt], module: str, name: str,
                notes: list[str], hops: int, scope: Found | None) -> Found:
        """The definition a binding statement in ``body`` leads to (``scope``: the class whose
        body it is, None at module level)."""
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            return Found(stmt, module, in_class=scope is not None)
        rebuilt = _rebuilt_from(stmt, body, name)
        if rebuilt is not None:
            notes.append(f"rebound by `{ast.unparse(stmt).splitlines()[0][:60]}...`; "
                         f"read from its {'class' if isinstance(rebuilt, ast.ClassDef) else 'def'}"
                         " statement")
            return Found(rebuilt, module, in_class=scope is not None)
        if hops <= 0:
            raise Missing(f"{name}: too many re-exports to follow (last in {module})")
        if isinstance(stmt, ast.ImportFrom):
            return self._follow_import(stmt, module, name, notes, hops)
        value = getattr(stmt, "value", None)
        if isinstance(value, ast.Name):
            notes.append(f"assigned from {value.id} in {module}")
            if scope is not None and last_binding(scope.node.body, value.id) is not None:
                return self.member(scope, value.id, notes, hops - 1)
            return self.lookup(module, value.id, notes, hops - 1)
        raise Missing(f"{name} in {module} is bound by `{ast.unparse(stmt)[:120]}`, "
                      "not defined by def/class")

    def _follow_import(self, stmt: ast.ImportFrom, module: str, name: str, notes: list[str],
                       hops: int) -> Found:
        source = self._absolute(stmt, module)
        original = next(a.name for a in stmt.names if (a.asname or a.name) == name)
        notes.append(f"re-exported from {source}")
        if source.split(".")[0] != "sglang":
            raise Missing(f"{name} in {module} is re-exported from {source}, outside sglang")
        return self.lookup(source, original, notes, hops - 1)

    def _absolute(self, stmt: ast.ImportFrom, module: str) -> str:
        """The absolute module name an ``ImportFrom`` in ``module`` reads."""
        if not stmt.level:
            return stmt.module or ""
        parsed = self.module(module)
        package = module.split(".") if parsed and parsed[1] else module.split(".")[:-1]
        base = package[: len(package) - stmt.level + 1]
        return ".".join(base + ([stmt.module] if stmt.module else []))

    def member(self, owner: Found, name: str, notes: list[str], hops: int) -> Found:
        """Attribute ``name`` of the class ``owner``: its body first, then its sglang bases."""
        stmt = last_binding(owner.node.body, name)
        if stmt is not None:
            return self._follow(stmt, owner.node.body, owner.module, name, notes, hops, scope=owner)
        for base in self._bases(owner, hops):
            try:
                found = self.member(base, name, [], hops - 1)
            except Missing:
                continue
            notes.append(f"inherited from {base.module}.{base.node.name}")
            return found
        raise Missing(f"{name} is not defined in class {owner.node.name} ({owner.module}) "
                      "or in its bases within sglang")

    def _bases(self, owner: Found, hops: int) -> list[Found]:
        """The class's base classes that can be found in sglang, in order."""
        if hops <= 0:
            return []
        bases = []
        for expr in owner.node.bases:
            expr = expr.value if isinstance(expr, ast.Subscript) else expr  # Generic[T]
            if not isinstance(expr, ast.Name):
                continue
            try:
                base = self.lookup(owner.module, expr.id, [], hops - 1)
            except Missing:
                continue  # outside sglang (Enum, ABC, torch.nn.Module, ...)
            if isinstance(base.node, ast.ClassDef):
                bases.append(base)
        return bases


# --- Rendering and comparing ----------------------------------------------------------------


@dataclass(frozen=True)
class Param:
    """One parameter: name, ``inspect.Parameter`` kind name, default as source text."""

    name: str
    kind: str
    default: str | None

    def __str__(self) -> str:
        prefix = {"VAR_POSITIONAL": "*", "VAR_KEYWORD": "**"}.get(self.kind, "")
        return prefix + self.name + ("" if self.default is None else f"={self.default}")


def parameters(args: ast.arguments) -> list[Param]:
    """The parameters of an ``ast.arguments`` in order, defaults via ``ast.unparse``."""
    positional = [(a, "POSITIONAL_ONLY") for a in args.posonlyargs]
    positional += [(a, "POSITIONAL_OR_KEYWORD") for a in args.args]
    defaults = [None] * (len(positional) - len(args.defaults)) + list(args.defaults)
    params = [Param(a.arg, kind, d and ast.unparse(d))
              for (a, kind), d in zip(positional, defaults)]
    if args.vararg:
        params.append(Param(args.vararg.arg, "VAR_POSITIONAL", None))
    params += [Param(a.arg, "KEYWORD_ONLY", d and ast.unparse(d))
               for a, d in zip(args.kwonlyargs, args.kw_defaults)]
    if args.kwarg:
        params.append(Param(args.kwarg.arg, "VAR_KEYWORD", None))
    return params


def format_signature(params: list[Param]) -> str:
    """``params`` the way ``inspect.Signature.__str__`` prints them (no annotations)."""
    out: list[str] = []
    for i, param in enumerate(params):
        previous = params[i - 1].kind if i else None
        if previous == "POSITIONAL_ONLY" and param.kind != "POSITIONAL_ONLY":
            out.append("/")
        if param.kind == "KEYWORD_ONLY" and previous not in ("KEYWORD_ONLY", "VAR_POSITIONAL"):
            out.append("*")
        out.append(str(param))
    if params and params[-1].kind == "POSITIONAL_ONLY":
        out.append("/")
    return f"({', '.join(out)})"


def parse_pin(pin: str) -> list[Param]:
    """The parameters of a pinned signature text such as ``"(self, x, *, y=None)"``."""
    function = ast.parse(f"def _pinned{pin.strip()}: pass").body[0]
    assert isinstance(function, ast.FunctionDef)
    return parameters(function.args)


def _decorators(node: ast.FunctionDef | ast.AsyncFunctionDef) -> set[str]:
    return {ast.unparse(d.func if isinstance(d, ast.Call) else d) for d in node.decorator_list}


def found_parameters(found: Found, resolver: Resolver) -> list[Param]:
    """What ``inspect.signature`` would show for the found definition."""
    node = found.node
    if isinstance(node, ast.ClassDef):  # a class: its __init__ without self
        init = resolver.member(found, "__init__", found.notes, MAX_HOPS)
        return found_parameters(Found(init.node, init.module, in_class=False), resolver)[1:]
    params = parameters(node.args)
    decorators = _decorators(node)
    if "property" in decorators or any(d.endswith(".setter") for d in decorators):
        raise Missing(f"{node.name} is a property, not a callable")
    if found.in_class and "classmethod" in decorators:
        return params[1:]
    return params


def diff_params(pinned: list[Param], found: list[Param]) -> list[str]:
    """Short lines saying which parameter names, kinds, defaults and order differ."""
    old, new = {p.name: p for p in pinned}, {p.name: p for p in found}
    lines = [f"- removed {old[n].name} ({old[n].kind})" for n in old if n not in new]
    lines += [f"+ added {p} ({p.kind})" for p in found if p.name not in old]
    for name in (n for n in old if n in new):
        a, b = old[name], new[name]
        if a.kind != b.kind:
            lines.append(f"~ {name}: {a.kind} -> {b.kind}")
        if a.default != b.default:
            lines.append(f"~ {name}: default {a.default or '(none)'} -> {b.default or '(none)'}")
    common_old = [n for n in old if n in new]
    common_new = [n for n in new if n in old]
    if common_old != common_new:
        lines.append(f"~ order: {', '.join(common_old)} -> {', '.join(common_new)}")
    if [(p.name, p.kind) for p in pinned] == [(p.name, p.kind) for p in found]:
        lines.append("(names and kinds unchanged: the plugin's runtime check still passes)")
    return lines


@dataclass
class Result:
    """The verdict for one pinned path."""

    path: str
    status: str  # "OK", "CHANGED" or "MISSING"
    pinned: str
    found: str | None = None
    notes: list[str] = field(default_factory=list)
    details: list[str] = field(default_factory=list)


def check_one(path: str, pin: str, resolver: Resolver) -> Result:
    """Compare one pin with the tree ``resolver`` reads."""
    notes: list[str] = []
    try:
        found = resolver.resolve(path)
        notes = found.notes
        params = found_parameters(found, resolver)
    except Missing as exc:
        return Result(path, "MISSING", pin, notes=notes, details=[str(exc)])
    pinned = parse_pin(pin)
    text = format_signature(params)
    if params == pinned:
        return Result(path, "OK", pin, text, notes)
    return Result(path, "CHANGED", pin, text, notes, diff_params(pinned, params))


def compare(pins: dict[str, str], tree: Tree) -> list[Result]:
    """Check every pin in ``pins`` (dotted path -> signature text) against ``tree``."""
    resolver = Resolver(tree)
    return [check_one(path, pin, resolver) for path, pin in pins.items()]


# --- Output and command line ----------------------------------------------------------------


def format_result(result: Result) -> list[str]:
    """The report lines for one result."""
    note = f"  [{'; '.join(result.notes)}]" if result.notes else ""
    if result.status == "MISSING":
        return [f"MISSING  {result.path}: {'; '.join(result.details)}{note}"]
    lines = [f"{result.status:<8} {result.path}{note}"]
    if result.status == "CHANGED":
        lines += [f"           pinned: {format_signature(parse_pin(result.pinned))}",
                  f"           found:  {result.found}"]
        lines += [f"           {line}" for line in result.details]
    return lines


def summary(results: list[Result]) -> str:
    """``N pinned: a OK, b CHANGED, c MISSING``."""
    counts = {s: sum(r.status == s for r in results) for s in ("OK", "CHANGED", "MISSING")}
    return f"{len(results)} pinned: " + ", ".join(f"{n} {s}" for s, n in counts.items())


def load_pins(path: Path = SIGNATURES_FILE) -> dict[str, str]:
    """Every pin in the plugin's ``signatures.py`` (each module-level ``*SIGNATURES`` dict),
    loaded from the file without importing the ``sglang_hsd`` package or SGLang."""
    spec = importlib.util.spec_from_file_location("_hsd_pinned_signatures", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    pins: dict[str, str] = {}
    for name, value in vars(module).items():
        if name.endswith("SIGNATURES") and isinstance(value, dict):
            pins.update(value)
    return pins


def main(argv: list[str] | None = None) -> int:
    """Run the comparison; 0 when every pin matches, 1 otherwise, 2 on a bad SOURCE."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("source", type=Path, help="folder holding sglang/, or a git directory")
    parser.add_argument("--rev", default="HEAD", help="revision of a git SOURCE (default HEAD)")
    args = parser.parse_args(argv)
    try:
        tree = open_tree(args.source, args.rev)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    results = compare(load_pins(), tree)
    print(f"# SGLang source: {tree.describe()}")
    print(f"# pins: {SIGNATURES_FILE.relative_to(ROOT)}")
    for result in results:
        print("\n".join(format_result(result)))
    print(summary(results))
    return 0 if all(r.status == "OK" for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
