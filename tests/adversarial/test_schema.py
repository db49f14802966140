"""The JSON Schema in docs/ agrees with the strict parser on honest and forged manifests."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest

from dk.errors import FormatError
from dk.pol.transcript import parse_manifest

SCHEMA = json.loads((Path(__file__).parents[2] / "docs" / "transcript.schema.json").read_text())


def test_honest_manifest_matches_schema(honest: tuple[object, Path]) -> None:
    _, bundle = honest
    m = json.loads((bundle / "manifest.json").read_text())
    jsonschema.validate(m, SCHEMA)
    parse_manifest((bundle / "manifest.json").read_bytes())


@pytest.mark.parametrize(
    "mutate",
    [
        lambda m: m.pop("transcript_root"),
        lambda m: m.update(extra=1),
        lambda m: m["checkpoints"][1].update(blob="../../etc/passwd"),
        lambda m: m["intervals"][0].update(update_norm=-1.0),
        lambda m: m.update(job_id="AB" * 32),
        lambda m: m.update(chunk_size=4096),
    ],
)
def test_schema_and_parser_both_reject(honest: tuple[object, Path], mutate: object) -> None:
    _, bundle = honest
    m = json.loads((bundle / "manifest.json").read_text())
    mutate(m)  # type: ignore[operator]
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(m, SCHEMA)
    blob_rule_only = m["checkpoints"][1]["blob"].startswith("../")
    if (
        not blob_rule_only
    ):  # the blob-name rule is enforced by the verifier (BAD_PATH), not the parser
        with pytest.raises(FormatError):
            parse_manifest(json.dumps(m).encode())
