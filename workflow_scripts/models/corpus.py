"""The training corpus: top-level definitions cut from the running interpreter's stdlib sources.

Why one definition per document: the realistic workload needs a model that stops by itself (natural EOS)
within a few hundred tokens, so each document is a single top-level function or class (decorators
included), or a method of a class too big to fit, later followed by EOS. Train/validation are split by FILE with a salted hash, so held-out
text is never seen in training, and the split does not depend on the model seed (the benchmark client
can call `heldout_documents()` without knowing how the pair was built).
"""

from __future__ import annotations

import ast
import hashlib
import sys
import sysconfig
import textwrap
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path, PurePosixPath

# Path parts that are not ordinary library code (tests, GUI demos, vendored packages, codec tables).
EXCLUDED_PARTS = frozenset(
    {"test", "tests", "idlelib", "site-packages", "dist-packages", "turtledemo", "__pycache__",
     "encodings", "pydoc_data", "ensurepip", "lib2to3", "__phello__"}
)
SPLIT_SALT = "specstudy-split-v1"
VAL_FRACTION = 0.1
MIN_CHARS = 120  # shorter definitions are mostly trivial one-liners
MAX_CHARS = 900  # ~400 tokens at the BPE's ~2.2 chars/token: keeps natural EOS within a realistic cap
_FUNCS = (ast.FunctionDef, ast.AsyncFunctionDef)
_DEFS = (*_FUNCS, ast.ClassDef)


@dataclass(frozen=True)
class SourceFile:
    """One stdlib source file, named by its path relative to the stdlib root (POSIX separators)."""

    relpath: str
    text: str


@dataclass(frozen=True)
class Corpus:
    """Documents of the train and validation files, plus what identifies them."""

    train_docs: list[str]
    val_docs: list[str]
    train_files: list[str]
    val_files: list[str]
    file_list_sha256: str
    content_sha256: str
    n_unparsable: int
    python_version: str


def stdlib_root() -> Path:
    """The stdlib directory of the running interpreter."""
    return Path(sysconfig.get_paths()["stdlib"])


def is_library_file(relpath: str) -> bool:
    """True for .py files that are ordinary library code (not tests, demos or vendored packages)."""
    path = PurePosixPath(relpath)
    if path.suffix != ".py" or path.name.startswith("test_") or path.name.startswith("config-"):
        return False
    return not any(part in EXCLUDED_PARTS or part.startswith("config-") for part in path.parts[:-1])


def stdlib_files(root: Path | None = None) -> list[SourceFile]:
    """All library files under `root` (default: this interpreter's stdlib), sorted by path."""
    root = root or stdlib_root()
    if not root.is_dir():
        raise FileNotFoundError(f"stdlib root {root} is not a directory")
    rels = sorted(p.relative_to(root).as_posix() for p in root.rglob("*.py"))
    return [SourceFile(rel, (root / rel).read_text(encoding="utf-8", errors="replace"))
            for rel in rels if is_library_file(rel)]


def is_validation_file(relpath: str) -> bool:
    """Deterministic, seed-independent file-level split: a salted hash of the path."""
    digest = hashlib.sha256(f"{SPLIT_SALT}:{relpath}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64 < VAL_FRACTION


def _source(node: ast.stmt, lines: list[str]) -> str:
    """A definition's source, decorators included, dedented (methods then read like functions)."""
    start = min([node.lineno, *(d.lineno for d in getattr(node, "decorator_list", []))]) - 1
    return textwrap.dedent("\n".join(lines[start:node.end_lineno])).rstrip() + "\n"


def top_level_definitions(text: str) -> list[str]:
    """One document per top-level function/class (with decorators) that fits the length cap.

    A class over the cap contributes its methods that fit instead (dedented): most stdlib code lives
    in big classes, and without them the corpus is only ~0.9 M chars, too little to train on.
    Raises SyntaxError when `text` does not parse.
    """
    lines = text.splitlines()
    docs = []
    for node in ast.parse(text).body:
        if not isinstance(node, _DEFS):
            continue
        doc = _source(node, lines)
        if len(doc) <= MAX_CHARS:
            candidates = [doc]
        elif isinstance(node, ast.ClassDef):
            candidates = [_source(m, lines) for m in node.body if isinstance(m, _FUNCS)]
        else:
            candidates = []
        docs.extend(d for d in candidates if MIN_CHARS <= len(d) <= MAX_CHARS)
    return docs


def build_corpus(max_files: int | None = None, root: Path | None = None) -> Corpus:
    """Cut the documents of every library file (or the first `max_files` of a seed-free order).

    `max_files` keeps the smoke preset fast; the subset is the files with the smallest path hash,
    so it spreads over the whole library and stays the same across runs.
    """
    files = stdlib_files(root)
    if max_files is not None:
        if max_files < 2:
            raise ValueError(f"max_files must be >= 2, got {max_files}")
        files = sorted(files, key=lambda f: hashlib.sha256(f.relpath.encode()).digest())[:max_files]
        files.sort(key=lambda f: f.relpath)
    train_docs, val_docs, train_files, val_files = [], [], [], []
    n_unparsable = 0
    content = hashlib.sha256()
    for f in files:
        content.update(f.relpath.encode() + b"\0" + f.text.encode() + b"\0")
        try:
            docs = top_level_definitions(f.text)
        except SyntaxError:
            n_unparsable += 1
            continue
        if is_validation_file(f.relpath):
            val_files.append(f.relpath)
            val_docs.extend(docs)
        else:
            train_files.append(f.relpath)
            train_docs.extend(docs)
    if not train_docs or not val_docs:
        raise ValueError(f"corpus split is empty (train docs {len(train_docs)}, val docs {len(val_docs)}); "
                         f"use more files than max_files={max_files}")
    file_list = "\n".join(f.relpath for f in files).encode()
    return Corpus(train_docs, val_docs, train_files, val_files, hashlib.sha256(file_list).hexdigest(),
                  content.hexdigest(), n_unparsable, sys.version.split()[0])


@lru_cache(maxsize=1)
def _default_corpus() -> Corpus:
    return build_corpus()


def heldout_documents() -> list[str]:
    """The validation documents of the full corpus (as the default preset trains), without EOS."""
    return list(_default_corpus().val_docs)
