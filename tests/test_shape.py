"""The package's shape: modules short enough to hold, and no import circle among them.

The import graph is read from the source with ``ast``, not by importing: an edge A -> B
for every ``import`` / ``from ... import`` statement in A that names a module B of the
package, whether at module level or inside a function or method (a deferred import still
ties the two modules together, it only hides the circle until the function runs). Imports
under ``if TYPE_CHECKING:`` are left out: they never run, and they are how a type
annotation may name a module that imports this one.

Names resolve as Python resolves them: relative imports against the importing module's
package; ``from pkg import name`` imports the submodule ``pkg.name`` when there is one,
otherwise ``pkg`` itself; and ``from lightning_stream import X``, where ``X`` is one of
the public names ``lightning_stream/__init__.py`` imports lazily (its ``_PUBLIC`` map),
imports the module ``_PUBLIC`` names for ``X``. Importing a submodule also runs its
package's ``__init__``; no edge is drawn for that, since the package's ``__init__`` files
import nothing at import time.
"""

from __future__ import annotations

import ast
import io
import re
import subprocess
import tokenize
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PACKAGE = REPO / "lightning_stream"
MAX_LINES = 350


def _module_name(path: Path, package: Path) -> str:
    parts = path.relative_to(package.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules(package: Path = PACKAGE) -> dict[str, Path]:
    return {_module_name(path, package): path for path in sorted(package.rglob("*.py"))}


def _lazy_public_names(package: Path) -> dict[str, str]:
    """``_PUBLIC`` of the package's ``__init__``: public name -> the module defining it."""
    tree = ast.parse((package / "__init__.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(target, ast.Name) and target.id == "_PUBLIC" for target in node.targets
        ):
            return ast.literal_eval(node.value)
    return {}


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _import_nodes(tree: ast.AST, in_functions: bool = True) -> list[ast.Import | ast.ImportFrom]:
    """Every import statement in ``tree`` at any depth, except under ``if TYPE_CHECKING:``
    and, unless ``in_functions``, in function bodies."""
    found: list[ast.Import | ast.ImportFrom] = []
    pending = [tree]
    while pending:
        node = pending.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found.append(node)
        if isinstance(node, ast.If) and _is_type_checking(node):
            pending.extend(node.orelse)
            continue
        if not in_functions and isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        pending.extend(ast.iter_child_nodes(node))
    return found


def _imported(
    name: str,
    path: Path,
    modules: dict[str, Path],
    root: str,
    lazy: dict[str, str],
    in_functions: bool = True,
) -> set[str]:
    """The modules of package ``root`` that its module ``name`` (at ``path``) imports
    (``in_functions``: in function bodies too)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    targets: set[str] = set()
    tree = ast.parse(path.read_text(), filename=str(path))
    for node in _import_nodes(tree, in_functions):
        if isinstance(node, ast.Import):
            targets.update(alias.name for alias in node.names)
            continue
        base = node.module or ""
        if node.level:
            anchor = package.split(".")
            anchor = anchor[: len(anchor) - (node.level - 1)]
            base = ".".join([*anchor, base] if base else anchor)
        for alias in node.names:
            submodule = f"{base}.{alias.name}"
            if submodule in modules:
                targets.add(submodule)
            elif base == root and alias.name in lazy:
                targets.add(lazy[alias.name])
            else:
                targets.add(base)
    return {target for target in targets if target in modules and target != name}


def import_graph(package: Path = PACKAGE) -> dict[str, set[str]]:
    """Each module of ``package`` -> the modules of ``package`` it imports."""
    modules = _modules(package)
    lazy = _lazy_public_names(package)
    return {
        name: _imported(name, path, modules, package.name, lazy) for name, path in modules.items()
    }


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle as ``[a, b, ..., a]``, or ``None`` when the graph has none."""
    done: set[str] = set()
    for start in sorted(graph):
        if start in done:
            continue
        # depth-first walk with an explicit stack of each path module's remaining targets
        path = [start]
        stack = [iter(sorted(graph[start]))]
        while stack:
            target = next(stack[-1], None)
            if target is None:
                stack.pop()
                done.add(path.pop())
            elif target in path:
                return [*path[path.index(target) :], target]
            elif target not in done:
                path.append(target)
                stack.append(iter(sorted(graph[target])))
    return None


def test_no_module_over_the_line_limit() -> None:
    lengths = {name: len(path.read_text().splitlines()) for name, path in _modules().items()}
    too_long = {name: n for name, n in lengths.items() if n > MAX_LINES}
    assert not too_long, f"modules over {MAX_LINES} lines: {too_long}"


def test_package_inits_import_nothing_at_import_time() -> None:
    # what lets the graph leave out the edge from a submodule to its package's __init__
    modules = _modules()
    lazy = _lazy_public_names(PACKAGE)
    for name, path in modules.items():
        if path.name == "__init__.py":
            imported = _imported(name, path, modules, PACKAGE.name, lazy, in_functions=False)
            assert not imported, f"{name} imports {sorted(imported)} when it is imported"


def test_no_import_circle() -> None:
    cycle = find_cycle(import_graph())
    assert cycle is None, "import circle: " + " -> ".join(cycle or [])


def test_the_graph_sees_known_imports() -> None:
    # guards the reader itself: a graph with no edges would show no circle either
    graph = import_graph()
    assert "lightning_stream.lance.source" in graph["lightning_stream.lance.datamodule"]
    # a deferred import inside a function
    assert "lightning_stream.demo" in graph["lightning_stream.cli"]
    # a lazily exported public name
    assert "lightning_stream.monitor" in graph["lightning_stream.demo"]
    # a submodule imported by name from its package
    assert "lightning_stream.loop_state" in graph["lightning_stream.callback"]
    # TYPE_CHECKING imports are left out
    assert graph["lightning_stream"] == set()


def test_a_circle_is_found_and_named() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set()}
    assert find_cycle(graph) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set(), "c": {"b"}}) is None


def test_a_circle_through_deferred_and_submodule_imports_is_found(tmp_path: Path) -> None:
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text('_PUBLIC = {"Thing": "pkg.sub.b"}\n')
    (package / "sub" / "__init__.py").write_text("")
    (package / "a.py").write_text("from pkg.sub import b\n")
    (package / "sub" / "b.py").write_text("def f():\n    from .c import g\n")
    (package / "sub" / "c.py").write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from pkg import a\n"
        "def g():\n    from pkg import Thing\n"
    )
    graph = import_graph(package)
    assert graph["pkg.a"] == {"pkg.sub.b"}
    assert graph["pkg.sub.b"] == {"pkg.sub.c"}
    assert graph["pkg.sub.c"] == {"pkg.sub.b"}
    assert find_cycle(graph) == ["pkg.sub.b", "pkg.sub.c", "pkg.sub.b"]


def test_no_private_name_of_lancedb_or_lance_is_used():
    """The package uses lancedb's and lance's public API only: nothing imported from them
    under a leading underscore, and, in a module that imports them, no attribute with one
    read off anything but the module's own objects (``self``, ``cls``)."""
    found = []
    for name, path in _modules().items():
        tree = ast.parse(path.read_text())
        imported = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                imported |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module:
                root = node.module.split(".")[0]
                imported.add(root)
                if root in ("lancedb", "lance"):
                    private = [a.name for a in node.names if a.name.startswith("_")]
                    found += [f"{name}: {node.module}.{alias}" for alias in private]
                    if any(part.startswith("_") for part in node.module.split(".")):
                        found.append(f"{name}: {node.module}")
        if not imported & {"lancedb", "lance"}:
            continue
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Attribute)
                and node.attr.startswith("_")
                and not node.attr.startswith("__")
                and not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"))
            ):
                found.append(f"{name}:{node.lineno}: .{node.attr}")
    assert not found, f"private lancedb/lance names used: {found}"


def test_every_lightning_hook_is_marked_override_and_no_callback_method_misses_one():
    """A misspelled hook would never run: a callback's public methods must be Lightning
    hooks, and every hook the package defines carries ``@override``."""
    import importlib
    import inspect

    from lightning.pytorch import Callback, LightningDataModule

    classes = {
        cls
        for name in _modules()
        for _, cls in inspect.getmembers(importlib.import_module(name), inspect.isclass)
        if cls.__module__.startswith("lightning_stream")
        and issubclass(cls, (Callback, LightningDataModule))
    }
    assert len(classes) >= 6, classes  # the callbacks, their base and the data modules
    for cls in classes:
        base = Callback if issubclass(cls, Callback) else LightningDataModule
        for name, member in vars(cls).items():
            if name.startswith("_") or not callable(member):
                continue
            if hasattr(base, name):
                assert getattr(member, "__override__", False), f"{cls.__name__}.{name}"
            else:
                assert base is not Callback, f"{cls.__name__}.{name} is no Callback hook"


def test_lightning_private_loop_state_is_touched_in_loop_state_only():
    private = ("fit_loop", "epoch_loop", "batch_progress", "_signal_connector")
    for name, path in _modules().items():
        if name == "lightning_stream.loop_state":
            continue
        text = path.read_text()
        assert not [p for p in private if p in text], f"{name} touches Lightning's loops"


_FORMATTER_OFF = re.compile(r"#\s*fmt:\s*(skip|off)\b")


def _formatter_escapes(source: str) -> list[int]:
    """Lines of ``source`` whose comment turns the formatter off (``fmt: skip`` or
    ``fmt: off``); comments only, so a string that names the marker is no escape."""
    tokens = tokenize.generate_tokens(io.StringIO(source).readline)
    return [
        token.start[0]
        for token in tokens
        if token.type == tokenize.COMMENT and _FORMATTER_OFF.search(token.string)
    ]


def _tracked_python_files() -> list[Path]:
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--", "*.py"], cwd=REPO, capture_output=True, check=False
    )
    if listed.returncode == 0 and listed.stdout:
        names = [name for name in listed.stdout.decode().split("\0") if name]
        return [REPO / name for name in names if (REPO / name).exists()]
    # not a git checkout: the repository's own folders
    folders = ("lightning_stream", "tests", "benchmarks", "examples")
    return sorted(path for folder in folders for path in (REPO / folder).rglob("*.py"))


def test_the_formatter_escape_finder_sees_comments_only():
    source = 'x = [1,  2]  # fmt: skip\n# fmt: off\ny = "# fmt: skip"\n# fmt:skip\n'
    assert _formatter_escapes(source) == [1, 2, 4]


def test_no_python_file_turns_the_formatter_off():
    """Every tracked Python file (package, tests, benchmarks, examples) is as ``ruff
    format`` writes it: no line is kept out of the formatter by hand."""
    files = _tracked_python_files()
    assert PACKAGE / "__init__.py" in files and Path(__file__).resolve() in files
    found = [
        f"{path.relative_to(REPO)}:{line}"
        for path in files
        for line in _formatter_escapes(path.read_text())
    ]
    assert not found, f"formatter turned off at: {found}"


def test_one_serving_engine_reads_for_every_source() -> None:
    """Inline-or-pool reading lives in ``serving.py`` alone: the sources are formats over
    it and start no reader of their own."""
    graph = import_graph()
    readers = {"lightning_stream.workers.pool", "lightning_stream.workers.inline"}
    assert {name for name, targets in graph.items() if targets & readers} == {
        "lightning_stream.serving"
    }
    for source in ("lightning_stream.lance.source", "lightning_stream.video.source"):
        assert "lightning_stream.serving" in graph[source]


def _code_lines(path: Path) -> list[tuple[int, str]]:
    """``(line number, text with white space folded)`` of the lines that carry code: no
    blank, comment, import or docstring line."""
    tree = ast.parse(path.read_text())
    skipped: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            skipped.update(range(node.lineno, node.end_lineno + 1))
        body = getattr(node, "body", None)
        if (
            isinstance(body, list)
            and body
            and isinstance(body[0], ast.Expr)
            and isinstance(body[0].value, ast.Constant)
            and isinstance(body[0].value.value, str)
        ):
            skipped.update(range(body[0].lineno, body[0].end_lineno + 1))
    lines = []
    for number, text in enumerate(path.read_text().splitlines(), 1):
        folded = " ".join(text.split())
        if number in skipped or not folded or folded.startswith("#") or len(folded) < 4:
            continue
        lines.append((number, folded))
    return lines


def test_no_six_lines_of_code_stand_twice_in_the_package() -> None:
    """The same six lines of code (white space aside) in two places of the package would
    be one job written twice. (Runs alike but for names are looked for with the
    ``duplicates`` command when the package changes; see the CHANGELOG's process note.)"""
    run = 6
    seen: dict[tuple[str, ...], str] = {}
    repeated = []
    for path in sorted(PACKAGE.rglob("*.py")):
        lines = _code_lines(path)
        for start in range(len(lines) - run + 1):
            window = tuple(text for _, text in lines[start : start + run])
            place = f"{path.relative_to(PACKAGE)}:{lines[start][0]}"
            if window in seen and not seen[window].startswith(f"{path.relative_to(PACKAGE)}:"):
                repeated.append(f"{seen[window]} ~ {place}")
            seen.setdefault(window, place)
    assert not repeated, repeated
