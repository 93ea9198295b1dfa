"""JSON schemas from the wild: coverage (the share that compiles) and compliance (the share of
completed outputs that validate with ``jsonschema``) on the public schemas that
``bench/schemas.json`` lists (package, version, path: SchemaStore schemas vendored by
check-jsonschema, Jupyter's nbformat, AWS CloudFormation resource schemas from cfn-lint,
markdownlint's, Angular's and Nest's schematics). The packages are fetched with ``pip download``
and ``npm pack`` into ``--cache`` (nothing is vendored). Every failed validation is put down to
the keywords the lenient compile left unenforced when each of its errors comes from one of them.

    PYTHONPATH=. python bench/schemas.py [--model byte|default|ID] [--rows 2] [--max-tokens 192]
"""

from __future__ import annotations

import argparse
import io
import json
import subprocess
import sys
import tarfile
import tempfile
import time
import zipfile
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from llmsample.errors import UserError
from llmsample.sampling import constraint as constraints

MANIFEST = Path(__file__).with_name("schemas.json")


@dataclass
class Outcome:
    """One schema: compiled leniently (and strictly), what was left out, its rows' verdicts."""

    name: str
    schema: Any
    lenient_error: str | None = None
    strict_error: str | None = None
    ignored: tuple[str, ...] = ()
    verdicts: list[str] = field(default_factory=list)  # valid | invalid | invalid-ignored | incomplete | ...


def fetch(source: dict[str, Any], cache: Path) -> Path:
    """The package's archive in ``cache``, downloaded once with the registry's own client."""
    stem = source["package"].lstrip("@").replace("/", "-")
    pattern = f"{stem.replace('-', '_')}-{source['version']}*.whl" if source["registry"] == "pypi" else None
    found = sorted(cache.glob(pattern)) if pattern else sorted(cache.glob(f"{stem}-{source['version']}.tgz"))
    if found:
        return found[0]
    spec = f"{source['package']}=={source['version']}"
    if source["registry"] == "pypi":
        command = [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "-d", str(cache), spec]
    else:
        command = [
            "npm",
            "pack",
            "--silent",
            f"{source['package']}@{source['version']}",
            "--pack-destination",
            str(cache),
        ]
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
    return fetch(source, cache)


def read_schemas(cache: Path) -> list[tuple[str, Any]]:
    """``(package:path, schema)`` of every manifest entry."""
    schemas = []
    for source in json.loads(MANIFEST.read_text())["sources"]:
        archive = fetch(source, cache)
        if archive.suffix == ".whl":
            with zipfile.ZipFile(archive) as opened:
                texts = {path: opened.read(path) for path in source["paths"]}
        else:
            with tarfile.open(archive) as opened:
                texts = {path: opened.extractfile(path).read() for path in source["paths"]}  # type: ignore[union-attr]
        for path, raw in texts.items():
            schemas.append((f"{source['package']}:{path}", json.load(io.BytesIO(raw))))
    return schemas


def compile_all(schemas: list[tuple[str, Any]]) -> list[tuple[Outcome, Any]]:
    outcomes = []
    for name, schema in schemas:
        outcome, constraint = Outcome(name, schema), None
        try:
            constraint = constraints.json_schema(schema, name)
            outcome.ignored = constraint.ignored
        except UserError as exc:
            outcome.lenient_error = str(exc).removeprefix(f"{name}: ")[:160]
        try:
            constraints.json_schema(schema, name, strict=True)
        except UserError as exc:
            outcome.strict_error = str(exc).removeprefix(f"{name}: ")[:160]
        outcomes.append((outcome, constraint))
    return outcomes


def load(model: str) -> Any:
    from llmsample.models.loading import load_model

    if model == "byte":  # the tests' byte-level tiny model: it can spell any JSON
        from tests.constraints.conftest import make_byte_model

        return load_model(str(make_byte_model(Path(tempfile.mkdtemp()) / "byte")), "cpu", "float32")
    return load_model(None if model == "default" else model, "cpu", "float32")


def decode_all(lm: Any, compiled: list[tuple[Outcome, Any]], rows: int, max_tokens: int, temperature: float) -> None:
    """Every compiled schema's ``rows`` outputs, eight rows a step, each judged by ``jsonschema``."""
    from llmsample.engine.continuous_batch import BatchItem, decode_batch
    from llmsample.engine.prompt import encode_prompt
    from llmsample.events import RunStats, Summary
    from llmsample.sampling.config import SamplingConfig

    prompt = encode_prompt(lm, "Write one JSON document valid under the schema.", room=max_tokens)[0].tolist()
    items, schemas = [], {}
    for i, (outcome, constraint) in enumerate(compiled):
        if constraint is None:
            continue
        for seed in range(rows):
            cfg = SamplingConfig(temperature=temperature, max_tokens=max_tokens, constraint=constraint, seed=seed)
            items.append(BatchItem((i, seed), prompt, cfg, RunStats("m", "p", seed)))
            schemas[(i, seed)] = outcome
    for key, record in decode_batch(lm, items, 8):
        outcome = schemas[key]
        if isinstance(record, Summary):
            complete = record.facts.constraint is not None and record.facts.constraint.complete
            outcome.verdicts.append(judge(outcome.schema, record.text, outcome.ignored) if complete else "incomplete")
        elif not hasattr(record, "token_id"):  # a row that failed
            outcome.verdicts.append("failed")


def judge(schema: Any, text: str, ignored: tuple[str, ...]) -> str:
    """``valid``, ``invalid`` or ``invalid-ignored`` (every error from an unenforced keyword);
    ``unresolvable``: the schema refers to a document not at hand (a remote ``$ref``)."""
    import jsonschema
    from referencing import Registry
    from referencing.exceptions import Unresolvable

    document = json.loads(text)
    validator = jsonschema.validators.validator_for(schema, default=jsonschema.Draft7Validator)
    try:
        errors = list(validator(schema, registry=Registry()).iter_errors(document))
    except Unresolvable:
        return "unresolvable"
    if not errors:
        return "valid"
    names = {keyword.split(":")[0] for keyword in ignored} | ({"else"} if "if" in ignored else set())
    return "invalid-ignored" if all(error.validator in names for error in errors) else "invalid"


def report(outcomes: list[Outcome], seconds: float) -> dict[str, Any]:
    """The figures: coverage lenient and strict, compliance of completed outputs, the causes."""
    total = len(outcomes)
    verdicts = Counter(v for outcome in outcomes for v in outcome.verdicts)
    completed = sum(n for v, n in verdicts.items() if v not in ("incomplete", "failed"))
    judged = completed - verdicts["unresolvable"]
    outside = judged - verdicts["invalid-ignored"]
    figures = {
        "schemas": total,
        "coverage_lenient": sum(o.lenient_error is None for o in outcomes) / total,
        "coverage_strict": sum(o.strict_error is None for o in outcomes) / total,
        "with_ignored_keywords": sum(bool(o.ignored) for o in outcomes),
        "ignored_keywords": Counter(k.split(":")[0] for o in outcomes for k in o.ignored),
        "rows": sum(verdicts.values()),
        "completed": completed,
        "verdicts": dict(verdicts),
        "compliance": verdicts["valid"] / judged if judged else None,
        "compliance_outside_ignored": verdicts["valid"] / outside if outside else None,
        "seconds": round(seconds, 1),
    }
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="byte", help="byte (a tiny byte-level model), default, or a model id")
    parser.add_argument("--rows", type=int, default=2, help="outputs per schema (seeds 0..rows-1)")
    parser.add_argument("--max-tokens", type=int, default=192)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--cache", default=str(Path(tempfile.gettempdir()) / "llmsample-schemas"))
    parser.add_argument("--out", help="write each schema's outcome here (JSONL)")
    args = parser.parse_args()
    cache = Path(args.cache)
    cache.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    compiled = compile_all(read_schemas(cache))
    if args.rows:
        decode_all(load(args.model), compiled, args.rows, args.max_tokens, args.temperature)
    outcomes = [outcome for outcome, _ in compiled]
    for outcome in outcomes:
        if outcome.lenient_error or "invalid" in outcome.verdicts:
            print(f"{outcome.name}: {outcome.lenient_error or Counter(outcome.verdicts)}", file=sys.stderr)
    if args.out:
        with open(args.out, "w") as out:
            for o in outcomes:
                record = {"name": o.name, "lenient_error": o.lenient_error, "strict_error": o.strict_error,
                          "ignored": list(o.ignored), "verdicts": o.verdicts}  # fmt: skip
                out.write(json.dumps(record) + "\n")
    print(json.dumps(report(outcomes, time.perf_counter() - started), indent=1))


if __name__ == "__main__":
    main()
