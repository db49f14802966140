"""Generate ``vectors/fl/``: PRG outputs, field encoding, Shamir, secure-aggregation rounds,
packed bundles and round-job normal forms (SPEC Part VII).

Deterministic (fixed seeds); ``python -m vectors.gen fl``. Checked by :mod:`dk.vectors.fl`.
"""

from __future__ import annotations

import hashlib
import struct
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from dk.fl.field import HALF, P, dequantize, quantize
from dk.fl.graph import harary_graph, permutation
from dk.fl.secagg import Advert, commit_b, prg_field
from dk.fl.secure_round import (
    admission_message,
    field_bytes,
    masked_message,
    pack_adverts,
    pack_blobs,
    pack_indices,
)
from dk.fl.shamir import split_secret
from dk.fl.wire import MAGIC, unpack_bundle
from dk.vectors import write_cases
from dk.vectors.fl import secagg_round


def _number(cases: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{"tcId": i + 1, **c} for i, c in enumerate(cases)]


def _prg() -> list[dict[str, Any]]:
    cases: list[dict[str, Any]] = []
    for seed in (bytes(32), bytes(range(32)), hashlib.sha256(b"dk").digest()):
        out = [int(v) for v in prg_field(seed, 16)]
        cases.append(
            {
                "comment": "first 16 elements",
                "result": "valid",
                "seed": seed.hex(),
                "n": 16,
                "outputs": out,
            }
        )
    cases.append(
        {
            "comment": "31-byte seed",
            "result": "invalid",
            "seed": "00" * 31,
            "n": 4,
            "expected_reason": "ValueError",
        }
    )
    return _number(cases)


def _field() -> list[dict[str, Any]]:
    x = np.array(
        [0.0, 0.5 / 256, 1.5 / 256, -0.5 / 256, -2.5 / 256, 3.9, -100.0, 1e-9], dtype="<f4"
    )
    q = quantize(x, scale=256.0, clip=4.0, n=10, backend="reference")
    dec = dequantize(q, scale=256.0, backend="reference")
    return _number(
        [
            {
                "comment": "ties to even, clipping, negatives wrap to p - q",
                "result": "valid",
                "x": x.tobytes().hex(),
                "scale": 256.0,
                "clip": 4.0,
                "n": 10,
                "q": [int(v) for v in q],
                "decoded": dec.astype("<f8").tobytes().hex(),
            },
            {
                "comment": "n·clip·scale reaches p/2: the sum could wrap",
                "result": "invalid",
                "x": x.tobytes().hex(),
                "scale": 2.0**24,
                "clip": 100.0,
                "n": 10,
                "expected_reason": "ValueError",
            },
        ]
    )


def _shamir() -> list[dict[str, Any]]:
    rng = np.random.default_rng(1)
    secret = hashlib.sha256(b"secret").digest()
    sh = split_secret(secret, n=5, t=3, random_bytes=lambda k: rng.bytes(k))
    other = split_secret(bytes(32), n=5, t=3, random_bytes=lambda k: rng.bytes(k))
    return _number(
        [
            {
                "comment": "shares 1, 3, 4 of 5 (t = 3)",
                "result": "valid",
                "t": 3,
                "secret": secret.hex(),
                "shares": {str(i): sh[i].hex() for i in (1, 3, 4)},
            },
            {
                "comment": "all five shares",
                "result": "valid",
                "t": 3,
                "secret": secret.hex(),
                "shares": {str(i): s.hex() for i, s in enumerate(sh)},
            },
            {
                "comment": "two shares, t = 3",
                "result": "invalid",
                "t": 3,
                "shares": {"0": sh[0].hex(), "2": sh[2].hex()},
                "expected_reason": "SecAggError",
            },
            {
                "comment": "shares of two different secrets",
                "result": "invalid",
                "t": 3,
                "shares": {"0": sh[0].hex(), "1": sh[1].hex(), "2": other[2].hex()},
                "expected_reason": "SecAggError",
            },
        ]
    )


def _secagg() -> list[dict[str, Any]]:
    rng = np.random.default_rng(2)
    inputs = {str(u): [int(v) for v in rng.integers(0, P, 6, dtype=np.uint64)] for u in range(5)}
    inputs["0"][:2] = [0, P - 1]
    inputs["1"][:1] = [HALF]
    inputs8 = {str(u): [int(v) for v in rng.integers(0, P, 6, dtype=np.uint64)] for u in range(8)}
    session = hashlib.sha256(b"round").hexdigest()
    g = harary_graph(8, 2, bytes.fromhex(session))  # a ring: groups of 3
    ring_one = sorted(g[0])[:1]  # one neighbour of client 0 gone: its group keeps t = 2
    ring_two = sorted(g[0])  # both neighbours of client 0 gone: 1 < t survivors there
    cases = []
    for comment, before_input, before_unmask, result, n, t, degree in (
        ("no dropout", [], [], "valid", 5, 3, None),
        ("one client drops before its masked input", [3], [], "valid", 5, 3, None),
        (
            "n - t = 2 drop: one before input, one silent at unmasking",
            [1],
            [4],
            "valid",
            5,
            3,
            None,
        ),
        ("3 of 5 drop, t = 3: fails", [0, 1, 2], [], "invalid", 5, 3, None),
        ("SecAgg+ ring (k = 2, t = 2), no dropout", [], [], "valid", 8, 2, 2),
        ("SecAgg+ ring, one neighbour of client 0 drops", ring_one, [], "valid", 8, 2, 2),
        ("SecAgg+ ring, both neighbours of client 0 drop: fails", ring_two, [], "invalid", 8, 2, 2),
    ):
        c: dict[str, Any] = {
            "comment": comment,
            "result": result,
            "n": n,
            "t": t,
            "session": session,
            "rng_seed": 7,
            "inputs": inputs if n == 5 else inputs8,
            "drop_before_input": before_input,
            "drop_before_unmask": before_unmask,
        }
        if degree is not None:
            c["degree"] = degree
        if result == "valid":
            total, survivors, masked = secagg_round(c)
            c["survivors"] = sorted(survivors)
            c["sum"] = [int(v) for v in total]
            c["masked_sha256"] = hashlib.sha256(
                b"".join(masked[u].astype("<u8").tobytes() for u in sorted(masked))
            ).hexdigest()
        else:
            c["expected_reason"] = "SecAggError"
        cases.append(c)
    return _number(cases)


def _graph() -> list[dict[str, Any]]:
    cases: list[dict[str, Any]] = []
    for n, k, tag in ((12, 4, b"a"), (10, 8, b"b"), (6, 5, b"c"), (2, 1, b"d")):
        session = hashlib.sha256(tag).digest()
        cases.append(
            {
                "comment": f"H({k}, {n}) relabelled" + (" = complete" if k == n - 1 else ""),
                "result": "valid",
                "n": n,
                "k": k,
                "session": session.hex(),
                "permutation": permutation(n, session),
                "neighbours": [sorted(nb) for nb in harary_graph(n, k, session)],
            }
        )
    for n, k, why in ((12, 3, "odd degree below n - 1"), (5, 5, "degree n"), (5, 0, "degree 0")):
        cases.append(
            {
                "comment": why,
                "result": "invalid",
                "n": n,
                "k": k,
                "session": "00" * 32,
                "expected_reason": "ValueError",
            }
        )
    return _number(cases)


def _round_messages() -> list[dict[str, Any]]:
    session = hashlib.sha256(b"session").digest()
    adverts = {
        u: Advert(hashlib.sha256(b"c%d" % u).digest(), hashlib.sha256(b"s%d" % u).digest())
        for u in (0, 2, 3)
    }
    key_list = pack_adverts(adverts)
    peers = pack_indices([0, 3])
    y = field_bytes(np.array([0, 1, P - 1], dtype=np.uint64))
    b = bytes(range(32))
    job_id, worker, root = (hashlib.sha256(x).digest() for x in (b"job", b"worker", b"root"))
    adm = admission_message(session, 2, job_id, worker, adverts[2], commit_b(b, session))
    msk = masked_message(session, 2, root, key_list, peers, y)
    unsorted = b"\0\0\0\2" + key_list[4 + 68 : 4 + 136] + key_list[4 : 4 + 68]
    return _number(
        [
            {
                "comment": "key list, set, field vector; admission and masked-input messages",
                "result": "valid",
                "session": session.hex(),
                "adverts": {str(u): [a.c_pk.hex(), a.s_pk.hex()] for u, a in adverts.items()},
                "key_list": key_list.hex(),
                "peers": [0, 3],
                "peers_packed": peers.hex(),
                "y": [0, 1, P - 1],
                "y_packed": y.hex(),
                "b": b.hex(),
                "b_commit": commit_b(b, session).hex(),
                "index": 2,
                "job_id": job_id.hex(),
                "worker_key": worker.hex(),
                "final_root": root.hex(),
                "admission": adm.hex(),
                "masked": msk.hex(),
            },
            {
                "comment": "key list out of index order",
                "result": "invalid",
                "kind": "key_list",
                "data": unsorted.hex(),
                "n": 4,
                "expected_reason": "SecAggError",
            },
            {
                "comment": "key list index not below n",
                "result": "invalid",
                "kind": "key_list",
                "data": key_list.hex(),
                "n": 3,
                "expected_reason": "SecAggError",
            },
            {
                "comment": "blob entry over the ciphertext bound",
                "result": "invalid",
                "kind": "blobs",
                "data": pack_blobs({0: bytes(200)}).hex(),
                "n": 4,
                "expected_reason": "SecAggError",
            },
            {
                "comment": "field vector word >= p",
                "result": "invalid",
                "kind": "field",
                "data": (y[:8] + struct.pack("<I", P)).hex(),
                "n": 3,
                "expected_reason": "SecAggError",
            },
        ]
    )


def _pack(files: list[tuple[str, bytes]]) -> bytes:
    out = [MAGIC]
    for name, data in files:
        raw = name.encode()
        out += [struct.pack(">H", len(raw)), raw, struct.pack(">Q", len(data)), data]
    return b"".join(out)


def _wire() -> list[dict[str, Any]]:
    blob = f"blobs/{'ab' * 32}.safetensors"
    good = [("manifest.json", b"{}"), ("signature.hex", b"00\n"), (blob, b"\x00" * 9)]
    packed = _pack(good)
    with tempfile.TemporaryDirectory() as tmp:
        dest = unpack_bundle(packed, Path(tmp) / "b")
        files = {
            p.relative_to(dest).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(dest.rglob("*"))
            if p.is_file()
        }
    bad = "BUNDLE_MALFORMED"
    return _number(
        [
            {
                "comment": "manifest, signature, one blob",
                "result": "valid",
                "packed": packed.hex(),
                "files": files,
            },
            {
                "comment": "bad magic",
                "result": "invalid",
                "packed": b"DKB0".hex(),
                "expected_reason": bad,
            },
            {
                "comment": "path traversal",
                "result": "invalid",
                "packed": _pack([*good[:2], ("../evil", b"x")]).hex(),
                "expected_reason": bad,
            },
            {
                "comment": "absolute path",
                "result": "invalid",
                "packed": _pack([*good[:2], ("/tmp/evil", b"x")]).hex(),
                "expected_reason": bad,
            },
            {
                "comment": "duplicate name",
                "result": "invalid",
                "packed": _pack([*good, good[2]]).hex(),
                "expected_reason": bad,
            },
            {
                "comment": "truncated data",
                "result": "invalid",
                "packed": packed[:-4].hex(),
                "expected_reason": bad,
            },
            {
                "comment": "no signature",
                "result": "invalid",
                "packed": _pack([good[0], good[2]]).hex(),
                "expected_reason": bad,
            },
        ]
    )


_JOB = """
name = "fl"
[model]
arch = "mlp"
hidden = [4]
input_dim = 64
output_dim = 10
[data]
kind = "npz"
path = "client0.npz"
root = "{root}"
[train]
steps = 8
{train}
[pol]
interval = 4
init_root = "{init_root}"
{pol}
{init}
"""


def _job(init: str = "", init_root: str = "11" * 32, train: str = "", pol: str = "") -> str:
    return _JOB.format(init=init, root="22" * 32, init_root=init_root, train=train, pol=pol)


def _round_job() -> list[dict[str, Any]]:
    from dk.pol.job import parse_job

    w = "33" * 32
    a = _job(f'[init]\nmethod = "file"\nroot = "{w}"\npath = "r1/global.safetensors"')
    b = _job(f'[init]\nmethod = "file"\nroot = "{w}"\npath = "/elsewhere/global.safetensors"')
    assert parse_job(a).job_id == parse_job(b).job_id
    return _number(
        [
            {
                "comment": "round weights from a file pinned by init.root",
                "result": "valid",
                "toml": a,
                "job_id": parse_job(a).job_id.hex(),
            },
            {
                "comment": "same job, weights file elsewhere: init.path is not hashed",
                "result": "valid",
                "toml": b,
                "job_id": parse_job(b).job_id.hex(),
            },
            {
                "comment": "init.method = file without init.root",
                "result": "invalid",
                "toml": _job('[init]\nmethod = "file"\npath = "w.safetensors"'),
                "expected_reason": "JOB_MALFORMED",
            },
            {
                "comment": "init.path not a string",
                "result": "invalid",
                "toml": _job(f'[init]\nmethod = "file"\nroot = "{w}"\npath = 3'),
                "expected_reason": "JOB_MALFORMED",
            },
        ]
    )


def _dp_job() -> list[dict[str, Any]]:
    from dk.pol.job import parse_job

    dp = "[train.dp]\nnoise_multiplier = 1.1\nmax_grad_norm = 1.0\ndelta = 1e-5\n"
    base = _job(init_root="").replace('init_root = ""\n', "")
    ok = base + dp
    full = base + dp + 'target_epsilon = 0.0\naccountant = "rdp"\n'
    assert parse_job(ok).job_id == parse_job(full).job_id
    bad = "JOB_MALFORMED"
    return _number(
        [
            {
                "comment": "DP-SGD job; defaults filled in",
                "result": "valid",
                "toml": ok,
                "job_id": parse_job(ok).job_id.hex(),
            },
            {
                "comment": "defaults written out: same job_id",
                "result": "valid",
                "toml": full,
                "job_id": parse_job(full).job_id.hex(),
            },
            {
                "comment": "no noise_multiplier",
                "result": "invalid",
                "toml": base + "[train.dp]\nmax_grad_norm = 1.0\ndelta = 1e-5\n",
                "expected_reason": bad,
            },
            {
                "comment": "unknown DP key",
                "result": "invalid",
                "toml": ok + "clip = 1.0\n",
                "expected_reason": bad,
            },
            {
                "comment": "delta >= 1",
                "result": "invalid",
                "toml": ok.replace("delta = 1e-5", "delta = 1.0"),
                "expected_reason": bad,
            },
            {
                "comment": "DP on the dk kernels backend",
                "result": "invalid",
                "toml": ok.replace("interval = 4", 'interval = 4\nbackend = "dk"'),
                "expected_reason": bad,
            },
            {
                "comment": "DP with gradient compression",
                "result": "invalid",
                "toml": ok.replace("steps = 8", 'steps = 8\ncompression = "int8"'),
                "expected_reason": bad,
            },
        ]
    )


def generate(root: Path) -> None:
    """Write every ``vectors/fl/*.json`` file."""
    d = root / "fl"
    write_cases(d / "prg.json", "secagg-prg", _prg())
    write_cases(d / "field.json", "secagg-field", _field())
    write_cases(d / "shamir.json", "secagg-shamir", _shamir())
    write_cases(d / "secagg.json", "secagg-round", _secagg())
    write_cases(d / "graph.json", "secaggplus-graph", _graph())
    write_cases(d / "round_messages.json", "secure-round-messages", _round_messages())
    write_cases(d / "wire.json", "packed-bundle", _wire())
    write_cases(d / "round_job.json", "round-job", _round_job())
    write_cases(d / "dp_job.json", "dp-job", _dp_job())
