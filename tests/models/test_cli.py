"""Bad command lines: non-zero exit with one line that names the flag at fault."""

from __future__ import annotations

import subprocess
import sys

import pytest

from workflow_scripts.models.build import main


def test_module_cli_rejects_unknown_preset_in_one_line(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "workflow_scripts.models.build", "--preset", "huge", "--seed", "0",
         "--target-out", str(tmp_path / "t"), "--draft-out", str(tmp_path / "d")],
        capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "--preset" in lines[0] and "huge" in lines[0]
    assert not (tmp_path / "t").exists()


@pytest.mark.parametrize("args, fragment", [
    (["--seed", "abc"], "--seed"),
    (["--seed", "-1"], "--seed"),
    (["--set", "nokey"], "--set"),
    (["--set", "num_experts_per_tok=1"], "num_experts_per_tok"),
])
def test_bad_arguments_exit_2_naming_the_flag(tmp_path, capsys, args, fragment):
    base = {"--preset": "smoke", "--seed": "0", "--target-out": str(tmp_path / "t"), "--draft-out": str(tmp_path / "d")}
    argv = [x for k, v in base.items() if k not in args for x in (k, v)] + args
    try:
        rc = main(argv)
    except SystemExit as exc:  # argparse's own errors
        rc = exc.code
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2
    assert len(err) == 1 and fragment in err[0]
    assert not (tmp_path / "t").exists() and not (tmp_path / "d").exists()


def test_same_dir_for_target_and_draft_is_refused(tmp_path, capsys):
    same = str(tmp_path / "pair")
    assert main(["--preset", "smoke", "--seed", "0", "--target-out", same, "--draft-out", same]) == 2
    assert "--target-out" in capsys.readouterr().err
