"""Digests of this package's own source, so that editing the code that made an artifact remakes it.

Snakemake reruns a job when its rule's shell command or params change, not when a module that command
imports does: a faster engine would otherwise leave last week's measurements in place, looking current.
Rules pass `source_digest(...)` of the subpackages their job runs as a param (and benchmark cells key on it).

The digest is taken over each module's syntax tree without its docstrings, not over its bytes: a comment, a
docstring or a re-wrapped line changes nothing that runs, and re-measuring a study for one (the model build and
every cell, ~30 min on the 2-core machines) is what made editing them costly.
"""

from __future__ import annotations

import ast
import functools
import hashlib
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent
_DOCUMENTED = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)


@functools.lru_cache(maxsize=4096)
def code_of(source: str, path: Path) -> str:
    """What of a module runs: its syntax tree, without comments, layout or docstrings (ValueError naming the
    file if it does not parse). Cached by the source text itself, so an edited file is parsed again: Snakemake's
    parse and the cohort planner ask for the same digests many times in one process."""
    try:
        tree = ast.parse(source, filename=str(path))
    except SyntaxError as err:
        raise ValueError(f"source_digest: {path}:{err.lineno}: {err.msg}") from None
    for node in ast.walk(tree):
        if isinstance(node, _DOCUMENTED) and ast.get_docstring(node, clean=False) is not None:
            node.body = node.body[1:] or [ast.Pass()]
    return ast.dump(tree, annotate_fields=False, include_attributes=False)


def source_digest(*subpackages: str, root: Path = PACKAGE) -> str:
    """SHA-256 (16 hex digits) over the paths and the code (`code_of`) of every .py file under the named
    subpackages of root."""
    digest = hashlib.sha256()
    for name in subpackages:
        folder = root / name
        if not folder.is_dir():
            raise ValueError(f"source_digest: {folder} is not a subpackage of {root}")
        for path in sorted(folder.rglob("*.py")):
            code = code_of(path.read_text(encoding="utf-8"), path)
            digest.update(path.relative_to(root).as_posix().encode() + b"\0" + code.encode() + b"\0")
    return digest.hexdigest()[:16]
