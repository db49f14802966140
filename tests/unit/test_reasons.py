"""One vocabulary of reason codes (dk.reasons, SPEC §14.1): every code dk emits anywhere is in
it with an outcome and a meaning, SPEC lists each one, and the layers' enums are its own."""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

from dk import reasons
from dk.reasons import OUTCOMES, VERIFIER_SIDE, VOCABULARY, Reason, WireReason, ZkReason

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src" / "dk"
CODE = re.compile(r"^[A-Z][A-Z0-9]*(?:_[A-Z0-9]+)*$")
PREFIX = re.compile(r"^([A-Z][A-Z0-9]*(?:_[A-Z0-9]+)+): ")  # "STAKE_MOVED: ..." audit problems
# Upper-case strings in the source that are not reason codes: environment variables, SQL,
# HTTP methods, image formats and dtypes, click metavars, a table cell, the zk "OK" value.
NOT_CODES = {
    *("ADDRESS", "HELP", "FAIL", "OK", "PYTHONPATH", "UNSUPPORTED"),
    *("BEGIN", "COMMIT", "ROLLBACK", "PRAGMA", "BIGINT", "BYTEA", "IGNORE", "FULL", "NORMAL"),
    *("GET", "POST", "PNG", "JPEG", "RGB", "FAILED"),
    *("F32", "F64", "I64", "U8", "I32", "U64"),  # safetensors dtype names (SPEC §10.3)
    *("OMP_NUM_THREADS", "NUMBA_NUM_THREADS", "LOSS_KEY", "LOCAL_RANK"),
    *("ATEN_CPU_CAPABILITY", "PYTHON"),  # calibration's CPU variants: torch's variable, PYTHON*
}


def emitted_codes() -> dict[str, str]:
    """Every upper-case code-like string constant in src/dk (and every ``CODE: `` prefix)."""
    found: dict[str, str] = {}
    for f in sorted(SRC.rglob("*.py")):
        for node in ast.walk(ast.parse(f.read_text(encoding="utf-8"))):
            if not (isinstance(node, ast.Constant) and isinstance(node.value, str)):
                continue
            s = node.value
            m = PREFIX.match(s)
            name = m.group(1) if m else s if CODE.match(s) and len(s) > 1 else None
            if name and name not in NOT_CODES and not name.startswith(("DK_", "RAY_")):
                found.setdefault(name, str(f.relative_to(SRC)))
    return found


def test_every_emitted_code_is_in_the_vocabulary() -> None:
    found = emitted_codes()
    assert len(found) > 100  # the scan sees the codes (a broken scan would pass vacuously)
    missing = {c: where for c, where in found.items() if c not in VOCABULARY}
    assert missing == {}


def test_every_expected_reason_of_the_vectors_is_in_the_vocabulary() -> None:
    seen: set[str] = set()

    def walk(v: object) -> None:
        if isinstance(v, dict):
            for k, x in v.items():
                if k == "expected_reason" and isinstance(x, str) and CODE.match(x):
                    seen.add(x)
                walk(x)
        elif isinstance(v, list):
            for x in v:
                walk(x)

    for f in (ROOT / "vectors").rglob("*.json"):
        try:
            doc = json.loads(f.read_text(encoding="utf-8"))
        except ValueError:  # a case file holding a deliberately malformed document
            continue
        walk(doc)
    assert len(seen) > 20  # (exception names such as "FormatError" are not codes)
    assert sorted(seen - set(VOCABULARY)) == []


def test_spec_lists_every_code() -> None:
    spec = (ROOT / "SPEC.md").read_text(encoding="utf-8")
    assert [c for c in VOCABULARY if not re.search(rf"`{c}`|\b{c}\b", spec)] == []


def test_each_code_has_an_outcome_and_a_one_line_meaning() -> None:
    for name, code in VOCABULARY.items():
        assert code.name == name and CODE.match(name)
        assert code.outcome in OUTCOMES, name
        assert code.meaning and "\n" not in code.meaning and len(code.meaning) < 100, name
        assert re.fullmatch(r"(I|II|III|IV|V|VI|VII) §[\d.]+", code.spec), name


def test_report_codes_and_their_outcomes_follow_spec_14_1() -> None:
    spec = (ROOT / "SPEC.md").read_text(encoding="utf-8")
    row = next(line for line in spec.splitlines() if line.startswith("| `inconclusive` |"))
    inconclusive = set(re.findall(r"`([A-Z_]+)`", row.split("|")[2]))
    assert {r.value for r in VERIFIER_SIDE} == inconclusive
    for r in Reason:
        assert VOCABULARY[r.value].outcome in ("reject", "inconclusive"), r
    assert reasons.outcome(Reason.REPLAY_MISMATCH) == "reject"
    assert reasons.outcome("DATA_UNAVAILABLE") == "inconclusive"
    assert reasons.outcome("REPLAY") == "refused"


def test_the_layers_use_the_vocabulary() -> None:
    from dk.circuits.reasons import ZkReason as circuits_zk
    from dk.compress.wire import Reason as wire
    from dk.verifier.report import Reason as verifier

    assert circuits_zk is ZkReason and wire is WireReason and verifier is Reason
    assert all(z.value in VOCABULARY for z in ZkReason if z is not ZkReason.OK)
    wire_codes = [v for k, v in vars(WireReason).items() if not k.startswith("_")]
    assert len(wire_codes) == 19 and all(c in VOCABULARY for c in wire_codes)
