"""DataLoader workers: how they start, and checks made before they do, so that a
mistake is one clear error."""

from __future__ import annotations

import ast
import multiprocessing
import multiprocessing.forkserver
import pickle
import sys
import threading
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
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    if path is None or not path.endswith(".py"):
        return  # an interactive session or a frozen entry point: nothing to read
    try:
        with open(path, encoding="utf-8") as file:
            tree = ast.parse(file.read(), path)
    except (OSError, SyntaxError, ValueError):
        return
    if not any(_is_main_guard(node) for node in tree.body) and _runs_code(tree):
        raise RuntimeError(
            f"{path} starts training at module level and uses DataLoader workers, which"
            " import the script again in each worker process. Put the code that runs"
            ' (building the Trainer, calling fit) under if __name__ == "__main__":, or'
            " use num_workers=0"
        )


def _is_main_guard(node: ast.stmt) -> bool:
    return isinstance(node, ast.If) and "__main__" in ast.unparse(node.test)


def _runs_code(tree: ast.Module) -> bool:
    return any(
        isinstance(node, ast.Expr) and isinstance(node.value, ast.Call) for node in tree.body
    )


def worker_context(method: str) -> multiprocessing.context.BaseContext:
    """The workers' start method; a forkserver imports the reading side once.

    Workers forked from that server start without importing torch, numpy, pyarrow,
    lancedb, PyAV and this package again (:mod:`lightning_stream.forkserver_preload`).
    ``__main__`` is listed too, but Python 3.11's forkserver does not preload it, so
    every worker runs the training script's top-level imports again: Lightning is
    preloaded because a training script imports it (seconds per worker otherwise).
    """
    context = multiprocessing.get_context(method)
    if method == "forkserver":
        context.set_forkserver_preload(
            ["__main__", "lightning.pytorch", "lightning_stream.forkserver_preload"]
        )
    return context


def start_forkserver(method: str) -> None:
    """Start the workers' forkserver now, in the background, if ``method`` uses one.

    It takes seconds to import what it preloads; started at setup, it is ready by the
    time the first epoch starts its workers.
    """
    if method == "forkserver":
        worker_context(method)
        threading.Thread(
            target=multiprocessing.forkserver.ensure_running, name="forkserver-start", daemon=True
        ).start()
