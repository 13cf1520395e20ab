"""DataLoader workers: how they start, and checks made before they do, so that a
mistake is one clear error."""

from __future__ import annotations

import ast
import multiprocessing
import pickle
import sys
from typing import Any


def check_picklable(value: Any, argument: str) -> None:
    """Raise ``ValueError`` naming ``argument`` when workers could not receive ``value``."""
    try:
        pickle.dumps(value)
    except Exception as exc:
        raise ValueError(
            f"{argument}={value!r} cannot be sent to DataLoader worker processes ({exc});"
            f" define {argument} as a module-level function or a class instance (not a"
            " lambda or a local function), or use num_workers=0"
        ) from exc


def check_main_guard() -> None:
    """Raise ``RuntimeError`` when the ``__main__`` script runs its code unguarded.

    Workers started with spawn or forkserver import the main script again; without an
    ``if __name__ == "__main__":`` guard they would start training themselves and
    Python would stop them with a bootstrapping error that does not say why.
    """
    path, tree = _main_script()
    if tree is None:
        return  # an interactive session or a frozen entry point: nothing to read
    if not any(_is_main_guard(node) for node in tree.body) and _runs_code(tree):
        raise RuntimeError(
            f"{path} starts training at module level and uses worker processes, which"
            " import the script again in each worker process. Put the code that runs"
            ' (building the Trainer, calling fit) under if __name__ == "__main__":, or'
            " use num_workers=0"
        )


def _main_script() -> tuple[str | None, ast.Module | None]:
    """The ``__main__`` script's path and syntax tree (``None`` without a script file)."""
    path = getattr(sys.modules.get("__main__"), "__file__", None)
    if path is None or not path.endswith(".py"):
        return path, None
    try:
        with open(path, encoding="utf-8") as file:
            return path, ast.parse(file.read(), path)
    except (OSError, SyntaxError, ValueError):
        return path, None


def _is_main_guard(node: ast.stmt) -> bool:
    return isinstance(node, ast.If) and "__main__" in ast.unparse(node.test)


def _runs_code(tree: ast.Module) -> bool:
    return any(
        isinstance(node, ast.Expr) and isinstance(node.value, ast.Call) for node in tree.body
    )


def worker_context(method: str, modules: list[str]) -> multiprocessing.context.BaseContext:
    """The workers' start method; a forkserver imports ``modules`` once, for every worker.

    Python 3.11's forkserver does not preload ``__main__`` (even when asked), and every
    worker runs the training script's imports again, so the server also imports the
    modules the script imports at its top level: a worker then starts in a fraction of a
    second and holds only what it and the script need. Only the first data module to
    start the server chooses what it imports.
    """
    context = multiprocessing.get_context(method)
    if method == "forkserver":
        context.set_forkserver_preload(
            ["lightning_stream.forkserver_preload", *modules, *script_imports()]
        )
    return context


def script_imports() -> list[str]:
    """Modules the ``__main__`` script imports at its top level (already imported here).

    ``from package import name`` counts the module that defines ``name`` too: a package
    that imports its public names lazily (as this one does) imports it then.
    """
    _, tree = _main_script()
    if tree is None:
        return []
    names = []
    for node in tree.body:
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.append(node.module)
            package = sys.modules.get(node.module)
            for alias in node.names:
                defined_in = getattr(getattr(package, alias.name, None), "__module__", None)
                names += [f"{node.module}.{alias.name}", defined_in or ""]
    return list(dict.fromkeys(name for name in names if name in sys.modules))
