"""Check ``vectors/fl/`` with the library (SPEC.md Part VII)."""

from __future__ import annotations

import hashlib
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from dk.errors import FormatError
from dk.vectors import CaseResult, run_cases

AREA = "fl"


def _expect_error(fn: Any, case: dict[str, Any], kinds: tuple[type[Exception], ...]) -> str:
    try:
        fn()
    except kinds as e:
        reason = getattr(e, "reason", None) or type(e).__name__
        return "" if reason == case["expected_reason"] else f"raised {reason}"
    return "accepted an invalid case"


def _prg_case(case: dict[str, Any]) -> str:
    from dk.fl.secagg import prg_field

    if case["result"] == "invalid":
        return _expect_error(
            lambda: prg_field(bytes.fromhex(case["seed"]), case["n"]), case, (ValueError,)
        )
    got = prg_field(bytes.fromhex(case["seed"]), case["n"])
    return "" if [int(v) for v in got] == case["outputs"] else "outputs differ"


def _field_case(case: dict[str, Any]) -> str:
    from dk.fl.field import dequantize, quantize

    x = np.frombuffer(bytes.fromhex(case["x"]), "<f4")
    kw = {"scale": case["scale"], "clip": case["clip"], "n": case["n"]}
    if case["result"] == "invalid":
        return _expect_error(lambda: quantize(x, **kw), case, (ValueError,))
    for backend in ("reference", "numba"):
        q = quantize(x, backend=backend, **kw)
        if [int(v) for v in q] != case["q"]:
            return f"{backend} encoding differs"
        back = dequantize(q, scale=case["scale"], backend=backend)
        if back.astype("<f8").tobytes().hex() != case["decoded"]:
            return f"{backend} decoding differs"
    return ""


def _shamir_case(case: dict[str, Any]) -> str:
    from dk.fl.shamir import SecAggError, combine_shares

    shares = {int(k): bytes.fromhex(v) for k, v in case["shares"].items()}
    if case["result"] == "invalid":
        return _expect_error(lambda: combine_shares(shares, t=case["t"]), case, (SecAggError,))
    return "" if combine_shares(shares, t=case["t"]).hex() == case["secret"] else "wrong secret"


def _secagg_case(case: dict[str, Any]) -> str:
    from dk.fl.shamir import SecAggError

    def run() -> Any:
        return secagg_round(case)

    if case["result"] == "invalid":
        return _expect_error(run, case, (SecAggError,))
    total, survivors, masked = run()
    if sorted(survivors) != case["survivors"]:
        return "survivors differ"
    if [int(v) for v in total] != case["sum"]:
        return "sum differs"
    digest = hashlib.sha256(b"".join(masked[u].astype("<u8").tobytes() for u in sorted(masked)))
    return "" if digest.hexdigest() == case["masked_sha256"] else "masked inputs differ"


def secagg_round(case: dict[str, Any]) -> Any:
    """Re-run a vector's secure-aggregation round (its random bytes: ``default_rng(seed)``)."""
    from dk.fl.secagg import secure_sum

    rng = np.random.default_rng(case["rng_seed"])
    inputs = {int(u): np.array(v, dtype=np.uint64) for u, v in case["inputs"].items()}
    return secure_sum(
        inputs,
        n=case["n"],
        t=case["t"],
        session=bytes.fromhex(case["session"]),
        drop_before_input=case["drop_before_input"],
        drop_before_unmask=case["drop_before_unmask"],
        random_bytes=lambda k: rng.bytes(k),
        degree=case.get("degree"),
    )


def _graph_case(case: dict[str, Any]) -> str:
    from dk.fl.graph import harary_graph, permutation

    session = bytes.fromhex(case["session"])
    if case["result"] == "invalid":
        return _expect_error(
            lambda: harary_graph(case["n"], case["k"], session), case, (ValueError,)
        )
    if case["k"] < case["n"] - 1 and permutation(case["n"], session) != case["permutation"]:
        return "permutation differs"
    got = [sorted(nb) for nb in harary_graph(case["n"], case["k"], session)]
    return "" if got == case["neighbours"] else "neighbours differ"


def _messages_case(case: dict[str, Any]) -> str:
    from dk.fl.secagg import Advert, commit_b
    from dk.fl.secure_round import (
        admission_message,
        field_bytes,
        field_from_bytes,
        masked_message,
        pack_adverts,
        pack_indices,
        unpack_adverts,
        unpack_blobs,
    )
    from dk.fl.shamir import SecAggError

    if case["result"] == "invalid":
        data, n = bytes.fromhex(case["data"]), case["n"]
        parse = {
            "key_list": lambda: unpack_adverts(data, n),
            "blobs": lambda: unpack_blobs(data, n),
            "field": lambda: field_from_bytes(data, n),
        }[case["kind"]]
        return _expect_error(parse, case, (SecAggError,))
    h = bytes.fromhex
    session = h(case["session"])
    adverts = {int(u): Advert(h(a), h(b)) for u, (a, b) in case["adverts"].items()}
    key_list = pack_adverts(adverts)
    if key_list.hex() != case["key_list"] or unpack_adverts(key_list, 4) != adverts:
        return "key list differs"
    peers = pack_indices(case["peers"])
    y = field_bytes(np.array(case["y"], dtype=np.uint64))
    if peers.hex() != case["peers_packed"] or y.hex() != case["y_packed"]:
        return "set or field vector differs"
    bc = commit_b(h(case["b"]), session)
    if bc.hex() != case["b_commit"]:
        return "b commitment differs"
    u = case["index"]
    adm = admission_message(session, u, h(case["job_id"]), h(case["worker_key"]), adverts[u], bc)
    msk = masked_message(session, u, h(case["final_root"]), key_list, peers, y)
    if adm.hex() != case["admission"]:
        return "admission message differs"
    return "" if msk.hex() == case["masked"] else "masked-input message differs"


def _wire_case(case: dict[str, Any]) -> str:
    from dk.fl.wire import unpack_bundle

    data = bytes.fromhex(case["packed"])
    with tempfile.TemporaryDirectory() as tmp:
        dest = Path(tmp) / "b"
        if case["result"] == "invalid":
            return _expect_error(lambda: unpack_bundle(data, dest), case, (FormatError,))
        unpack_bundle(data, dest)
        files = {
            p.relative_to(dest).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(dest.rglob("*"))
            if p.is_file()
        }
    return "" if files == case["files"] else "unpacked files differ"


def _job_case(case: dict[str, Any]) -> str:
    from dk.pol.job import parse_job

    if case["result"] == "invalid":
        return _expect_error(lambda: parse_job(case["toml"]), case, (FormatError,))
    return "" if parse_job(case["toml"]).job_id.hex() == case["job_id"] else "job_id differs"


_CHECKS = {
    "prg.json": _prg_case,
    "field.json": _field_case,
    "shamir.json": _shamir_case,
    "secagg.json": _secagg_case,
    "graph.json": _graph_case,
    "round_messages.json": _messages_case,
    "wire.json": _wire_case,
    "round_job.json": _job_case,
    "dp_job.json": _job_case,
}


def check(root: Path) -> list[CaseResult]:
    """Re-derive every case under ``root/fl/``.

    Args:
        root: the ``vectors/`` directory.

    Returns:
        One :class:`CaseResult` per case.
    """
    return run_cases(root, AREA, _CHECKS)
