"""JSON schemas from the wild, for ``llmsample bench --constraints``: coverage (the share that
compiles, leniently as ``--json-schema`` does and with ``--strict-schema``) and compliance (the
share of completed outputs that validate with ``jsonschema``) on the public schemas that
``public_schemas.json`` lists by package, version and path (SchemaStore schemas vendored by
check-jsonschema, Jupyter's nbformat, AWS CloudFormation resource schemas from cfn-lint,
markdownlint's, Angular's and Nest's schematics). The packages are fetched once with the
registries' own clients (``pip download``, ``npm pack``) into the cache beside the default model
(nothing is vendored); a package that cannot be fetched is named and left out. A failed
validation is put down to the keywords the lenient compile left unenforced when each of its
errors comes from one of them."""

from __future__ import annotations

import io
import json
import shutil
import subprocess
import sys
import tarfile
import time
import zipfile
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from llmsample.errors import UserError
from llmsample.models.loading import LoadedModel
from llmsample.sampling import constraint as constraints

MANIFEST = Path(__file__).with_name("public_schemas.json")
SEEDS = 1
"""Outputs a schema (seeds 0, 1, ...), sampled at temperature 1, eight rows a step."""
PROMPT = "Write one JSON document valid under the schema."


@dataclass
class Outcome:
    """One schema: compiled leniently (and strictly), what was left out, its rows' verdicts."""

    name: str
    schema: Any
    lenient_error: str | None = None
    strict_error: str | None = None
    ignored: tuple[str, ...] = ()
    verdicts: list[str] = field(default_factory=list)  # valid | invalid | invalid-ignored | incomplete | ...


@dataclass(frozen=True)
class SchemaFigures:
    """Coverage, compliance and their causes; ``unfetched``: the packages left out."""

    schemas: int
    unfetched: list[str]
    coverage_lenient: float | None
    coverage_strict: float | None
    with_ignored_keywords: int
    ignored_keywords: dict[str, int]
    refused: dict[str, str]
    rows: int
    completed: int
    verdicts: dict[str, int]
    compliance: float | None
    compliance_outside_ignored: float | None
    seconds: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def lines(self) -> list[str]:
        if not self.schemas:
            return [f"public schemas: none fetched ({', '.join(self.unfetched) or 'the manifest lists none'})"]
        keywords = ", ".join(f"{name} {n}" for name, n in Counter(self.ignored_keywords).most_common(6))
        lines = [
            f"public schemas: {self.schemas}, coverage {self.coverage_lenient:.1%} (strict {self.coverage_strict:.1%}); "
            f"{self.with_ignored_keywords} with keywords left out ({keywords or 'none'})",
            f"  compliance of completed outputs {_share(self.compliance)} ({self.verdicts.get('valid', 0)} of "
            f"{self.completed - self.verdicts.get('unresolvable', 0)} judged; {self.rows - self.completed} of "
            f"{self.rows} rows ran out of tokens or failed), {self.seconds:.0f} s",
        ]
        lines += [f"  refused: {name}: {error}" for name, error in self.refused.items()]
        return lines + ([f"  not fetched: {', '.join(self.unfetched)}"] if self.unfetched else [])


def _share(value: float | None) -> str:
    return "-" if value is None else f"{value:.1%}"


def cache_dir() -> Path:
    from llmsample.models.gguf_to_hf import cache_home

    return cache_home() / "schemas"


def fetch(source: dict[str, Any], cache: Path) -> Path | None:
    """The package's archive in ``cache``, downloaded once; None when it cannot be."""
    stem = source["package"].lstrip("@").replace("/", "-")
    pattern = f"{stem.replace('-', '_')}-{source['version']}*.whl" if source["registry"] == "pypi" else f"{stem}-{source['version']}.tgz"
    found = sorted(cache.glob(pattern))
    if found:
        return found[0]
    spec = f"{source['package']}=={source['version']}" if source["registry"] == "pypi" else f"{source['package']}@{source['version']}"
    if source["registry"] == "pypi":
        command = [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "-d", str(cache), spec]
    elif shutil.which("npm"):
        command = ["npm", "pack", "--silent", spec, "--pack-destination", str(cache)]
    else:
        return None
    done = subprocess.run(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    found = sorted(cache.glob(pattern))
    return found[0] if done.returncode == 0 and found else None


def read_schemas(cache: Path, log: Callable[[str], None]) -> tuple[list[tuple[str, Any]], list[str]]:
    """``(package:path, schema)`` of every manifest entry whose package could be fetched, and
    the packages that could not."""
    cache.mkdir(parents=True, exist_ok=True)
    schemas, unfetched = [], []
    for source in json.loads(MANIFEST.read_text())["sources"]:
        log(f"reading {source['package']} {source['version']} ({source['registry']})")
        archive = fetch(source, cache)
        if archive is None:
            unfetched.append(f"{source['package']} {source['version']}")
            continue
        if archive.suffix == ".whl":
            with zipfile.ZipFile(archive) as opened:
                texts = {path: opened.read(path) for path in source["paths"]}
        else:
            with tarfile.open(archive) as opened:
                texts = {path: opened.extractfile(path).read() for path in source["paths"]}  # type: ignore[union-attr]
        schemas += [(f"{source['package']}:{path}", json.load(io.BytesIO(raw))) for path, raw in texts.items()]
    return schemas, unfetched


def compile_all(schemas: list[tuple[str, Any]]) -> list[tuple[Outcome, Any]]:
    """Every schema compiled leniently (kept, with what it left out) and strictly (its refusal)."""
    outcomes = []
    for name, schema in schemas:
        constraint, lenient = _compiled(name, schema, strict=False)
        _, strict = _compiled(name, schema, strict=True)
        ignored = constraint.ignored if constraint is not None else ()
        outcomes.append((Outcome(name, schema, lenient, strict, ignored), constraint))
    return outcomes


def _compiled(name: str, schema: Any, strict: bool) -> tuple[Any, str | None]:
    """The constraint, or None and why it was refused (without the name it starts with)."""
    try:
        return constraints.json_schema(schema, name, strict=strict), None
    except UserError as exc:
        return None, str(exc).removeprefix(f"{name}: ")[:160]


def decode_all(lm: LoadedModel, compiled: list[tuple[Outcome, Any]], max_tokens: int) -> None:
    """Every compiled schema's :data:`SEEDS` outputs, eight rows a step, each judged."""
    from llmsample.engine.continuous_batch import BatchItem, RowFailed, decode_batch
    from llmsample.engine.prompt import encode_prompt
    from llmsample.events import RunStats, Summary
    from llmsample.sampling.config import SamplingConfig

    prompt = encode_prompt(lm, PROMPT, room=max_tokens)[0].tolist()
    items, owners = [], {}
    for i, (outcome, constraint) in enumerate(compiled):
        for seed in range(SEEDS if constraint is not None else 0):
            cfg = SamplingConfig(temperature=1.0, max_tokens=max_tokens, constraint=constraint, seed=seed)
            items.append(BatchItem((i, seed), prompt, cfg, RunStats(lm.name, "bench", seed)))
            owners[(i, seed)] = outcome
    for key, record in decode_batch(lm, items, 8) if items else ():
        outcome = owners[key]
        if isinstance(record, Summary):
            complete = record.facts.constraint is not None and record.facts.constraint.complete
            outcome.verdicts.append(judge(outcome.schema, record.text, outcome.ignored) if complete else "incomplete")
        elif isinstance(record, RowFailed):
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


def figures(outcomes: list[Outcome], unfetched: list[str], seconds: float) -> SchemaFigures:
    total = len(outcomes)
    verdicts = Counter(v for outcome in outcomes for v in outcome.verdicts)
    completed = sum(n for v, n in verdicts.items() if v not in ("incomplete", "failed"))
    judged = completed - verdicts["unresolvable"]
    outside = judged - verdicts["invalid-ignored"]
    return SchemaFigures(
        schemas=total, unfetched=unfetched,
        coverage_lenient=sum(o.lenient_error is None for o in outcomes) / total if total else None,
        coverage_strict=sum(o.strict_error is None for o in outcomes) / total if total else None,
        with_ignored_keywords=sum(bool(o.ignored) for o in outcomes),
        ignored_keywords=dict(Counter(k.split(":")[0] for o in outcomes for k in o.ignored)),
        refused={o.name: o.lenient_error for o in outcomes if o.lenient_error is not None},
        rows=sum(verdicts.values()), completed=completed, verdicts=dict(verdicts),
        compliance=verdicts["valid"] / judged if judged else None,
        compliance_outside_ignored=verdicts["valid"] / outside if outside else None,
        seconds=round(seconds, 1),
    )  # fmt: skip


def run_schema_benchmark(lm: LoadedModel, max_tokens: int, log: Callable[[str], None]) -> SchemaFigures:
    """The manifest's schemas fetched (once), compiled, and :data:`SEEDS` outputs each decoded on
    ``lm`` and judged."""
    started = time.perf_counter()
    schemas, unfetched = read_schemas(cache_dir(), log)
    compiled = compile_all(schemas)
    log(f"{sum(c is not None for _, c in compiled)} of {len(compiled)} schemas compiled; decoding {SEEDS} output(s) each")
    decode_all(lm, compiled, max_tokens)
    return figures([outcome for outcome, _ in compiled], unfetched, time.perf_counter() - started)
