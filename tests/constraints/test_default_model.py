"""The issue's end-to-end case on the real default model: a person as JSON under a schema."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest

from tests.conftest import cli_env

pytestmark = pytest.mark.model

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 40},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
    },
    "required": ["name", "age"],
    "additionalProperties": False,
}


def test_the_default_model_answers_with_a_valid_person(tmp_path: Path) -> None:
    schema = tmp_path / "person.json"
    schema.write_text(json.dumps(PERSON))
    command = [sys.executable, "-m", "llmsample", "generate", "-p", "Give me a person with a name and an age",
               "--json-schema", str(schema), "--seed", "0", "-n", "60", "-q"]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, env=cli_env(), timeout=600)
    assert result.returncode == 0, result.stderr
    person = json.loads(result.stdout)
    jsonschema.validate(person, PERSON)
    assert person["name"].strip()
