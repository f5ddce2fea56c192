"""Copy SGLang's fused-MoE tuner out of a source checkout and fix its `text_config` bug, by shape.

The bug (SGLang v0.5.9; fixed upstream in v0.5.10rc0 by PR #20232): `get_model_config()` in
`common_utils.py` unwraps `config.get_text_config()` *before* it reads `config.architectures[0]` and
`config.quantization_config`. For Qwen3.5-style configs both live on the top level only, so the tuner
dies on `None[0]`, and had it not, the `,block_shape=[...]` part of the tuned file name would be lost
and the server would never find the file. We recognise the shape from the syntax tree (not from a
version string), add the two lost fields back inside the unwrap, and leave everything else alone.

CLI: python -m workflow_scripts.moe.patch_tuner --checkout DIR --model DIR --tp-size T --out DIR --report FILE.json
(the model's MoE shapes are read here too, so a model without MoE fields is refused before any GPU work)
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from workflow_scripts.io import atomic_write_json
from workflow_scripts.moe.model_shapes import read_moe_shape

TUNER_SUBDIR = Path("benchmark/kernels/fused_moe_triton")
TUNER_SCRIPT = "tuning_fused_moe_triton.py"
COMMON_UTILS = "common_utils.py"
# Flags this study passes to the tuner; a tuner without them is a shape we don't know.
REQUIRED_FLAGS = ("--model", "--tp-size", "--ep-size", "--dtype", "--batch-size", "--tune", "--seed")
MARKER = "# specstudy: keep architectures and quantization_config across the text_config unwrap"
_KEPT = ("architectures", "quantization_config")

BUGGY = "buggy"
FIXED_UPSTREAM = "already fixed upstream"
ALREADY_PATCHED = "already patched"


class TunerShapeError(RuntimeError):
    """The tuner's source is not a shape we know how to judge; the message names the file and why."""


@dataclass
class Diagnosis:
    """Where, in get_model_config's top-level statements, the unwrap and the reads happen."""

    status: str
    unwrap: ast.If
    lost: list[str] = field(default_factory=list)  # fields the unwrap loses and we must keep


def _is_config_attr(node: ast.AST, attr: str) -> bool:
    return (
        isinstance(node, ast.Attribute)
        and node.attr == attr
        and isinstance(node.value, ast.Name)
        and node.value.id == "config"
    )


def _reads(stmt: ast.stmt, attr: str) -> bool:
    return any(_is_config_attr(n, attr) and isinstance(n.ctx, ast.Load) for n in ast.walk(stmt))


def _assigns(stmt: ast.stmt, attr: str) -> bool:
    return any(_is_config_attr(n, attr) and isinstance(n.ctx, ast.Store) for n in ast.walk(stmt))


def _is_unwrap(stmt: ast.stmt) -> bool:
    """`if hasattr(config, "text_config"): ... config.get_text_config() ...`"""
    if not isinstance(stmt, ast.If):
        return False
    test = stmt.test
    is_hasattr = (
        isinstance(test, ast.Call)
        and isinstance(test.func, ast.Name)
        and test.func.id == "hasattr"
        and len(test.args) == 2
        and isinstance(test.args[0], ast.Name)
        and test.args[0].id == "config"
        and isinstance(test.args[1], ast.Constant)
        and test.args[1].value == "text_config"
    )
    calls_unwrap = any(
        isinstance(n, ast.Call) and _is_config_attr(n.func, "get_text_config") for s in stmt.body for n in ast.walk(s)
    )
    return is_hasattr and calls_unwrap


def diagnose(source: str, path: Path) -> Diagnosis:
    """Judge common_utils.py's shape; TunerShapeError when it is none of buggy / fixed / patched."""
    try:
        tree = ast.parse(source)
    except SyntaxError as err:
        raise TunerShapeError(f"{path}: not parseable Python ({err})") from err
    funcs = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "get_model_config"]
    if len(funcs) != 1:
        raise TunerShapeError(f"{path}: expected one top-level get_model_config(), found {len(funcs)}")
    body = funcs[0].body
    unwraps = [i for i, s in enumerate(body) if _is_unwrap(s)]
    if len(unwraps) != 1:
        raise TunerShapeError(
            f"{path}: get_model_config() has {len(unwraps)} `if hasattr(config, \"text_config\")` unwraps calling "
            "config.get_text_config(); expected exactly one"
        )
    at = unwraps[0]
    unwrap = body[at]
    first_read = {}
    for attr in _KEPT:
        reads = [i for i, s in enumerate(body) if i != at and _reads(s, attr)]
        first_read[attr] = reads[0] if reads else None
    if first_read["architectures"] is None:
        raise TunerShapeError(f"{path}: get_model_config() never reads config.architectures; unknown shape")
    lost = [
        attr
        for attr in _KEPT
        if first_read[attr] is not None and first_read[attr] > at and not _assigns(unwrap, attr)
    ]
    if lost:
        return Diagnosis(BUGGY, unwrap, lost)
    if any(first_read[a] is not None and first_read[a] > at for a in _KEPT):
        return Diagnosis(ALREADY_PATCHED, unwrap)
    return Diagnosis(FIXED_UPSTREAM, unwrap)


def _fix_lines(lost: list[str], indent: str) -> tuple[list[str], list[str]]:
    """Lines to put at the start and at the end of the unwrap's body."""
    before = [f"{indent}{MARKER}\n", f"{indent}_specstudy_top_config = config\n"]
    after = []
    for attr in lost:
        after += [
            f'{indent}if getattr(config, "{attr}", None) is None and getattr(_specstudy_top_config, "{attr}", None) is not None:\n',
            f"{indent}    config.{attr} = _specstudy_top_config.{attr}\n",
        ]
    return before, after


def patch_source(source: str, path: Path) -> tuple[str, Diagnosis]:
    """The fixed source and the diagnosis of the original; unchanged source unless it was buggy."""
    diag = diagnose(source, path)
    if diag.status != BUGGY:
        return source, diag
    lines = source.splitlines(keepends=True)
    first, last = diag.unwrap.body[0], diag.unwrap.body[-1]
    indent = " " * first.col_offset
    before, after = _fix_lines(diag.lost, indent)
    lines[last.end_lineno : last.end_lineno] = after  # end first, so the start's line number still holds
    lines[first.lineno - 1 : first.lineno - 1] = before
    fixed = "".join(lines)
    again = diagnose(fixed, path)
    if again.status != ALREADY_PATCHED:
        raise TunerShapeError(f"{path}: the fix did not take (after patching the file reads as {again.status!r})")
    return fixed, diag


def tuner_flags(script: Path) -> list[str]:
    """The `--flags` the tuner's argparse declares, read from its syntax tree."""
    tree = ast.parse(script.read_text(), filename=str(script))
    flags = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "add_argument":
            flags.update(a.value for a in node.args if isinstance(a, ast.Constant) and str(a.value).startswith("--"))
    return sorted(flags)


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def prepare_tuner(checkout: Path, out: Path) -> dict:
    """Copy the tuner dir from `checkout` to `out`, fix common_utils.py if needed; returns the patch record."""
    src = checkout / TUNER_SUBDIR
    if not checkout.is_dir():
        raise FileNotFoundError(f"sglang.checkout {checkout}: no such directory (an SGLang source checkout is needed)")
    for name in (TUNER_SCRIPT, COMMON_UTILS):
        if not (src / name).is_file():
            raise FileNotFoundError(f"sglang.checkout {checkout}: {TUNER_SUBDIR / name} is missing; not an SGLang checkout?")
    flags = tuner_flags(src / TUNER_SCRIPT)
    missing = [f for f in REQUIRED_FLAGS if f not in flags]
    if missing:
        raise TunerShapeError(f"{src / TUNER_SCRIPT}: unknown tuner shape, it lacks flags {missing}")
    original = (src / COMMON_UTILS).read_text()
    fixed, diag = patch_source(original, src / COMMON_UTILS)
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".tuner-", dir=out.parent))
    try:
        copy = staging / "tuner"
        shutil.copytree(src, copy, ignore=shutil.ignore_patterns("__pycache__"))
        (copy / COMMON_UTILS).write_text(fixed)
        if out.exists():
            shutil.rmtree(out)
        copy.rename(out)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return {
        "checkout": str(checkout.resolve()),
        "tuner_dir": str(out.resolve()),
        "status": diag.status,
        "fixed_fields": diag.lost,
        "common_utils_sha256_before": _sha256(original),
        "common_utils_sha256_after": _sha256(fixed),
        "tuner_flags": flags,
    }


def main(argv: list[str] | None = None) -> None:
    """CLI entry point of the patch rule."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkout", type=Path, required=True, help="SGLang source checkout (config sglang.checkout)")
    parser.add_argument("--model", type=Path, required=True, help="the model to tune (dir or config.json)")
    parser.add_argument("--tp-size", type=int, default=1)
    parser.add_argument("--ep-size", type=int, default=1)
    parser.add_argument("--out", type=Path, required=True, help="where the patched tuner dir goes")
    parser.add_argument("--report", type=Path, required=True, help="JSON record of what was found and done")
    args = parser.parse_args(argv)
    shape = read_moe_shape(args.model, args.tp_size, args.ep_size)
    record = prepare_tuner(args.checkout, args.out)
    record["shape"] = shape.to_dict()
    atomic_write_json(args.report, record)
    print(f"tuner at {record['tuner_dir']}: {record['status']}" + (f", kept {record['fixed_fields']}" if record["fixed_fields"] else ""))


if __name__ == "__main__":
    main()
