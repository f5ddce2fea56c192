"""An edit to the code that made an artifact must change the digest the rules rerun on."""

import pytest
import yaml
from snakemake.utils import validate

from workflow_scripts.client.cohorts import member_identity
from workflow_scripts.code_version import source_digest


def test_digest_follows_python_sources_only(tmp_path):
    pkg = tmp_path / "engine"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "a.py").write_text("x = 1\n")
    (pkg / "sub" / "b.py").write_text("y = 2\n")
    first = source_digest("engine", root=tmp_path)
    assert source_digest("engine", root=tmp_path) == first  # stable
    (pkg / "notes.txt").write_text("not code")
    assert source_digest("engine", root=tmp_path) == first
    (pkg / "sub" / "b.py").write_text("y = 3\n")
    edited = source_digest("engine", root=tmp_path)
    assert edited != first
    (pkg / "sub" / "b.py").rename(pkg / "b2.py")  # same bytes, other module: other code
    assert source_digest("engine", root=tmp_path) != edited


def test_comments_docstrings_and_layout_do_not_count(tmp_path):
    pkg = tmp_path / "engine"
    pkg.mkdir()
    module = pkg / "m.py"
    module.write_text('"""Old words."""\n\n\ndef f(x):\n    """Why."""\n    return x + 1  # note\n')
    first = source_digest("engine", root=tmp_path)
    module.write_text('"""New words, on\ntwo lines."""\n# a comment\ndef f(x):\n    return (x +\n            1)\n')
    assert source_digest("engine", root=tmp_path) == first
    module.write_text('def f(x):\n    return x + 2\n')
    assert source_digest("engine", root=tmp_path) != first
    module.write_text('def f(x):\n    """Why."""\n    "a string after the docstring is code"\n    return x + 1\n')
    assert source_digest("engine", root=tmp_path) != first


def test_a_module_that_does_not_parse_is_named(tmp_path):
    (tmp_path / "engine").mkdir()
    (tmp_path / "engine" / "broken.py").write_text("def f(:\n")
    with pytest.raises(ValueError, match=r"broken\.py:1"):
        source_digest("engine", root=tmp_path)


def test_unknown_subpackage_is_named(tmp_path):
    with pytest.raises(ValueError, match="nope"):
        source_digest("nope", root=tmp_path)


def test_member_identity_carries_the_embedded_engine_code():
    config = yaml.safe_load(open("config/smoke.yaml"))
    validate(config, "config/schema.yaml")  # fills the schema's defaults, as rules/common.smk does
    assert config["engine"] == "embedded"
    name, args = next(iter(config["settings"].items()))
    assert member_identity(config, name, args)["engine_code"] == source_digest("engine", "server")
    config["engine"] = "sglang"  # SGLang reports its own version; our digest would be noise
    assert "engine_code" not in member_identity(config, name, args)
