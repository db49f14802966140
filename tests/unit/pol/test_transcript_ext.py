"""Extension objects (SPEC §11.5): committed in the header and leaves, keys only from the table."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from dk.crypto.canonical_json import canonical_json
from dk.crypto.hashing import TAG_TRANSCRIPT_EXT, tagged_hash
from dk.errors import FormatError
from dk.pol import transcript as tr


def _manifest() -> dict[str, Any]:
    m: dict[str, Any] = {
        "format": tr.BUNDLE_FORMAT,
        "version": tr.BUNDLE_VERSION,
        "chunk_size": 65536,
        "job_id": "11" * 32,
        "worker_key": "22" * 32,
        "data_root": "33" * 32,
        "interval": 2,
        "steps": 4,
        "checkpoints": [
            {
                "index": j,
                "step": 2 * j,
                "root": f"{j:02x}" * 32,
                "blob": f"blobs/{f'{j:02x}' * 32}.safetensors",
                "nbytes": 10,
            }
            for j in range(3)
        ],
        "intervals": [
            {
                "index": i,
                "start_step": 2 * i,
                "end_step": 2 * i + 2,
                "batch_commitment": "44" * 32,
                "update_norm": 0.5,
            }
            for i in range(2)
        ],
    }
    m["transcript_root"] = tr.transcript_root(m).hex()
    return m


def _check_tag(v: Any, where: str) -> None:
    if not isinstance(v, str) or len(v) > 8:
        raise ValueError(f"{where} must be a short string")


@pytest.fixture
def registered(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(tr.INTERVAL_EXTENSIONS, "tag", _check_tag)
    monkeypatch.setitem(tr.RUN_EXTENSIONS, "tag", _check_tag)


def test_ext_digest_is_tagged_hash_of_canonical_json() -> None:
    assert tr.ext_digest(None) == bytes(32)
    obj = {"b": [1, 2], "a": 0.1}
    assert tr.ext_digest(obj) == tagged_hash(TAG_TRANSCRIPT_EXT, b'{"a":0.1,"b":[1,2]}')
    assert canonical_json(obj) == b'{"a":0.1,"b":[1,2]}'


@pytest.mark.usefixtures("registered")
@pytest.mark.parametrize("where", ["run", "interval"])
def test_ext_is_committed_and_parsed(where: str) -> None:
    m = _manifest()
    plain = tr.transcript_root(m)
    target = m if where == "run" else m["intervals"][1]
    target["ext"] = {"tag": "x"}
    with_ext = tr.transcript_root(m)
    assert with_ext != plain
    target["ext"] = {"tag": "y"}
    assert tr.transcript_root(m) not in (plain, with_ext)
    m["transcript_root"] = tr.transcript_root(m).hex()
    man = tr.parse_manifest(canonical_json(m))
    if where == "run":
        assert man.ext == {"tag": "y"}
    else:
        assert man.interval_entries[1].ext == {"tag": "y"}
        assert man.interval_entries[0].ext is None


@pytest.mark.usefixtures("registered")
@pytest.mark.parametrize(
    "ext", [{}, [1], {"tag": "far too long"}, {"other": "x"}, {"tag": "x" * 8, "zz": 1}]
)
def test_bad_ext_is_malformed(ext: Any) -> None:
    for where in ("run", "interval"):
        m = copy.deepcopy(_manifest())
        (m if where == "run" else m["intervals"][0])["ext"] = ext
        with pytest.raises(FormatError) as e:
            tr.parse_manifest(canonical_json(m))
        assert e.value.reason == "MANIFEST_MALFORMED"


def test_no_key_is_defined_without_registration() -> None:
    m = _manifest()
    m["intervals"][0]["ext"] = {"tag": "x"}
    with pytest.raises(FormatError, match="unknown key"):
        tr.parse_manifest(canonical_json(m))


def test_oversized_ext_is_malformed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(tr.INTERVAL_EXTENSIONS, "blob", lambda v, w: None)
    m = _manifest()
    m["intervals"][0]["ext"] = {"blob": "a" * tr.MAX_EXT_BYTES}
    with pytest.raises(FormatError, match="over"):
        tr.parse_manifest(canonical_json(m))


def test_parsed_ext_digests_give_the_same_root(registered: None) -> None:
    """``parse_manifest`` hashes each ``ext`` once (``Manifest.ext_digests``, the run's at
    ``-1``); the root from those digests is the root from the objects, and the digests are
    what the root is computed from (a wrong one changes it)."""
    m = _manifest()
    m["ext"] = {"tag": "run"}
    m["intervals"][1]["ext"] = {"tag": "b"}
    man = tr.parse_manifest(canonical_json(m))
    assert set(man.ext_digests) == {-1, 1}
    assert man.ext_digests[-1] == tr.ext_digest({"tag": "run"})
    assert man.ext_digests[1] == tr.ext_digest({"tag": "b"})
    root = tr.transcript_root(man.raw)
    assert tr.transcript_root(man.raw, man.ext_digests) == root
    for key in (-1, 1):
        wrong = {**man.ext_digests, key: bytes(32)}
        assert tr.transcript_root(man.raw, wrong) != root


@pytest.mark.parametrize(
    ("version", "ok"),
    [
        ("2.13.0", True),
        ("2.13.0rc1", True),
        ("2.6.0.dev20241112", True),  # a nightly: an honest worker's release string
        ("2.5.1.post2", True),
        ("2", False),
        ("2.13.0.dev", False),
        ("2.13.0+cpu", False),
        ("latest", False),
    ],
)
def test_release_strings_of_spec_vi_4(version: str, ok: bool) -> None:
    from dk.pol.backends.ext import check_run_ext

    if ok:
        check_run_ext({"torch": version}, "ext.rounding")
    else:
        with pytest.raises(ValueError):
            check_run_ext({"torch": version}, "ext.rounding")


def test_a_torch_that_names_no_release_is_refused_before_recording(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    """The verifier would reject the manifest: the worker learns it before training."""
    import torch
    from tests.helpers import tiny_job

    from dk.errors import JobMismatch
    from dk.pol.backends.recording import RoundingRecorder

    job = tiny_job(pol={"backend": "rounded"})
    RoundingRecorder(job, tmp_path)  # this torch names a release
    monkeypatch.setattr(torch, "__version__", "2.13.0.devel+cpu")
    with pytest.raises(JobMismatch, match="no release SPEC VI §4 can name"):
        RoundingRecorder(job, tmp_path)
