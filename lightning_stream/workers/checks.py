"""Checks made before workers start, so that a mistake is one clear error at ``setup``."""

from __future__ import annotations

import ast
import pickle
import pickletools
import sys
from typing import Any

_STRINGS = {"SHORT_BINUNICODE", "BINUNICODE", "BINUNICODE8", "UNICODE", "STRING", "BINSTRING"}


def check_sendable(value: Any, argument: str) -> None:
    """Raise naming ``argument`` when worker processes could not receive ``value``: it
    does not pickle (``ValueError``), or it is defined in a training script that would
    train again in every worker that imports it (``RuntimeError``)."""
    try:
        data = pickle.dumps(value)
    except Exception as exc:
        raise ValueError(
            f"{argument}={value!r} cannot be sent to worker processes ({exc}); define"
            f" {argument} as a module-level function or a class instance (not a lambda or a"
            " local function), or use num_workers=0"
        ) from exc
    if "__main__" in pickled_modules(data):
        check_main_guard(argument)


def pickled_modules(data: bytes) -> set[str]:
    """The modules whose names a pickle refers to (the modules unpickling imports)."""
    modules: set[str] = set()
    strings: list[str] = []  # the strings pushed so far, and those fetched from the memo
    memo: dict[int, Any] = {}
    for opcode, arg, _ in pickletools.genops(data):
        name = opcode.name
        if name == "GLOBAL":
            modules.add(arg.split(" ")[0])
        elif name == "STACK_GLOBAL" and len(strings) >= 2:
            modules.add(strings[-2])
        elif name in _STRINGS:
            strings.append(arg)
        elif name == "MEMOIZE":
            memo[len(memo)] = strings[-1] if strings else None
        elif name in ("BINGET", "LONG_BINGET", "GET") and isinstance(memo.get(arg), str):
            strings.append(memo[arg])
    return modules


def check_main_guard(what: str) -> None:
    """Raise ``RuntimeError`` when the ``__main__`` script, which defines ``what`` and so
    runs in every worker, starts training unguarded."""
    path, tree = _main_script()
    if tree is None:
        return  # an interactive session or a frozen entry point: nothing to read
    if not any(_is_main_guard(node) for node in tree.body) and _runs_code(tree):
        raise RuntimeError(
            f"{what} is defined in {path}, so every worker process imports that script,"
            " and the script starts training at module level. Put the code that runs"
            ' (building the Trainer, calling fit) under if __name__ == "__main__":, move'
            f" {what} into a module of its own, or use num_workers=0"
        )


def main_script_path() -> str | None:
    """The ``__main__`` script's path, ``None`` without a script file."""
    path = getattr(sys.modules.get("__main__"), "__file__", None)
    return path if path is not None and path.endswith(".py") else None


def _main_script() -> tuple[str | None, ast.Module | None]:
    """The ``__main__`` script's path and syntax tree (``None`` without a script file)."""
    path = main_script_path()
    if path is None:
        return None, None
    try:
        with open(path, encoding="utf-8") as file:
            return path, ast.parse(file.read(), path)
    except (OSError, SyntaxError, ValueError):
        return path, None


def _is_main_guard(node: ast.stmt) -> bool:
    return isinstance(node, ast.If) and "__main__" in ast.unparse(node.test)


def _runs_code(tree: ast.Module) -> bool:
    """Whether the script's top level does more than define things: a call made for its
    effect (``trainer.fit(...)``) or a block that runs (a loop, ``with``, ``try``)."""
    blocks = (ast.For, ast.While, ast.With, ast.Try, ast.If)
    return any(
        (isinstance(node, ast.Expr) and isinstance(node.value, ast.Call))
        or isinstance(node, blocks)
        for node in tree.body
    )
