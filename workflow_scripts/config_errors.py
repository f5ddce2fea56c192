"""One-line config errors: the key at fault and what is allowed, instead of a dump of the schema.

Snakemake's own `validate` flattens the jsonschema error into a long text, so the study checks the config with
jsonschema first and reports the best-matching violation in one line.
"""

from __future__ import annotations

from pathlib import Path

import yaml
from jsonschema import Draft202012Validator, ValidationError
from jsonschema.exceptions import best_match


def describe(error: ValidationError) -> str:
    """`config key settings.baseline: 'foo' was unexpected; allowed keys: ...` for one schema violation."""
    path = ".".join(str(part) for part in error.absolute_path) or "(top level)"
    message = f"config key {path}: {error.message}"
    if error.validator == "additionalProperties" and "properties" in error.schema:
        message += f"; allowed keys: {', '.join(error.schema['properties'])}"
    elif error.validator in ("oneOf", "anyOf") and "description" in error.schema:
        message += f"; allowed: {error.schema['description']}"
    return message


def schema_error(config: dict, schema_file: Path) -> str | None:
    """The one-line description of the config's most relevant schema violation, or None when it is valid."""
    schema = yaml.safe_load(Path(schema_file).read_text())
    error = best_match(Draft202012Validator(schema).iter_errors(config))
    return None if error is None else describe(error)
