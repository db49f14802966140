"""The job's ``[data]`` table (SPEC §6.1), the root cache (SPEC §7.6), and jobs on every data
kind end to end: train, prove, verify; a changed dataset is refused."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
from tests.helpers import make_bundle

from dk.errors import FormatError
from dk.pol import default_job
from dk.pol.data import (
    Dataset,
    cache,
    check_root,
    data_root,
    load_dataset,
    load_tokens,
    write_shards,
)
from dk.pol.data import base as data_base
from dk.pol.data.images import installed_decoder
from dk.pol.data.synth import digits_image_folder, token_file
from dk.pol.job import parse_job
from dk.verifier import verify_bundle

DIMS = "[model]\ninput_dim = 64\noutput_dim = 10\n"


@pytest.fixture(autouse=True)
def _env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("DK_DATA_THREADS", "1")
    monkeypatch.setenv("DK_CACHE_DIR", str(tmp_path / "cache"))


# -- [data] ----------------------------------------------------------------------------------


def test_data_table_normal_form() -> None:
    assert parse_job(DIMS).data == {"kind": "digits", "root": ""}
    job = parse_job(DIMS + '[data]\nkind = "tokens"\npath = "t.bin"\nseq_len = 8\n')
    assert job.data == {
        "kind": "tokens",
        "path": "t.bin",
        "root": "",
        "dtype": "uint16",
        "seq_len": 8,
    }
    assert "path" not in job.hashed_form()["data"]
    other = parse_job(DIMS + '[data]\nkind = "tokens"\npath = "u.bin"\nseq_len = 9\n')
    assert other.job_id != job.job_id  # seq_len is hashed
    img = parse_job(DIMS + '[data]\nkind = "images"\npath = "i"\ndecoder = "pillow==1.0"\n')
    assert img.data["mode"] == "RGB" and img.data["decoder"] == "pillow==1.0"


@pytest.mark.parametrize(
    "table, match",
    [
        ('kind = "mnist"', "data.kind must be one of"),
        ('dataset = "npz"', "data.dataset is now data.kind"),
        ('kind = "shards"', "data.path is required"),
        ('kind = "tokens"\npath = "t"', "data.seq_len is required"),
        ('kind = "tokens"\npath = "t"\nseq_len = 0', "seq_len must be an integer"),
        ('kind = "tokens"\npath = "t"\nseq_len = 4\ndtype = "int8"', "data.dtype must be"),
        ('kind = "npz"\npath = "d.npz"\nseq_len = 4', "only for kind = 'tokens'"),
        ('kind = "images"\npath = "i"', "data.decoder is required"),
        ('kind = "images"\npath = "i"\ndecoder = "cv2"', "pillow=="),
        ('kind = "images"\npath = "i"\ndecoder = "pillow==1"\nmode = "CMYK"', "data.mode"),
        ("colour = 1", "unknown key data.colour"),
        ('root = "AB"', "root must be 64 lowercase hex"),
    ],
)
def test_data_table_refusals(table: str, match: str) -> None:
    with pytest.raises(FormatError, match=match) as e:
        parse_job(DIMS + "[data]\n" + table + "\n")
    assert e.value.reason == "JOB_MALFORMED" and "\n" not in str(e.value)


# -- root cache --------------------------------------------------------------------------------


def _counting(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    calls: list[int] = []
    real = data_base.stream_root

    def counted(*a: object, **kw: object) -> bytes:
        calls.append(1)
        return real(*a, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(data_base, "stream_root", counted)
    monkeypatch.setattr(cache, "MIN_CACHED_BYTES", 0)
    return calls


def test_root_cache_by_file_identity(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    calls = _counting(monkeypatch)
    p = tmp_path / "t.bin"
    p.write_bytes(np.arange(1000, dtype="<u2").tobytes())
    r1 = load_tokens(p, dtype="uint16", seq_len=8).root()
    assert len(calls) == 1 and len(list(cache.cache_dir().iterdir())) == 1
    assert load_tokens(p, dtype="uint16", seq_len=8).root() == r1
    assert len(calls) == 1  # a second run does not read the file
    assert load_tokens(p, dtype="uint16", seq_len=16).root() == r1  # seq_len: not in the root
    assert len(calls) == 1
    assert load_tokens(p, dtype="uint32", seq_len=8).root() != r1  # dtype: in the layout
    assert len(calls) == 2
    # same size, mtime restored: ctime still changes, so the changed file is not trusted
    st = os.stat(p)
    data = bytearray(p.read_bytes())
    data[10] ^= 1
    p.write_bytes(bytes(data))
    os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns))
    r2 = load_tokens(p, dtype="uint16", seq_len=8).root()
    assert len(calls) == 3 and r2 != r1
    # a damaged entry is a miss, and the cache can be turned off
    for f in cache.cache_dir().iterdir():
        f.write_text("not a root")
    assert load_tokens(p, dtype="uint16", seq_len=8).root() == r2 and len(calls) == 4
    monkeypatch.setenv("DK_DATA_CACHE", "0")
    assert load_tokens(p, dtype="uint16", seq_len=8).root() == r2 and len(calls) == 5


def test_small_datasets_and_arrays_are_not_cached(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    p = tmp_path / "t.bin"
    p.write_bytes(np.arange(1000, dtype="<u2").tobytes())
    load_tokens(p, dtype="uint16", seq_len=8).root()
    assert not cache.cache_dir().exists()  # under MIN_CACHED_BYTES
    calls = _counting(monkeypatch)
    X = np.zeros((4, 2), np.float32)
    Dataset(X, np.zeros(4, np.int64)).root()
    Dataset(X, np.zeros(4, np.int64)).root()
    assert len(calls) == 2  # in-memory arrays have no file identity


def test_check_root(tmp_path: Path) -> None:
    X, y = np.ones((4, 2), np.float32), np.arange(4, dtype=np.int64)
    job = parse_job(DIMS + f'[data]\nroot = "{data_root(X, y).hex()}"\n')
    assert check_root(job, Dataset(X, y)) == data_root(X, y)
    with pytest.raises(FormatError, match=r"differs from the job's data\.root") as e:
        check_root(job, Dataset(X + 1, y))
    assert e.value.reason == "DATA_MISMATCH"


# -- jobs on each kind, end to end -------------------------------------------------------------


def test_shards_job_end_to_end(tmp_path: Path) -> None:
    digits = load_dataset(parse_job(DIMS))
    write_shards(digits, tmp_path / "shards", shard_size=500)
    job = default_job(
        arch="linear",
        dataset="shards",
        data_path="shards",
        base_dir=tmp_path,
        steps=8,
        interval=4,
        batch_size=16,
    )
    assert job.data["root"] == digits.root().hex()  # sharding keeps the root
    job, bundle = make_bundle(tmp_path, job)
    assert verify_bundle(bundle, job, beacon=bytes(32), samples=2).ok
    np.save(tmp_path / "shards" / "000001.y.npy", np.zeros(500, np.int64))
    assert verify_bundle(bundle, job, beacon=bytes(32)).codes == ["DATA_UNAVAILABLE"]


@pytest.mark.slow
def test_images_job_end_to_end(tmp_path: Path) -> None:
    digits_image_folder(tmp_path / "img", n=64)
    job = default_job(
        arch="cnn",
        dataset="images",
        data_path="img",
        base_dir=tmp_path,
        steps=4,
        interval=2,
        batch_size=8,
    )
    assert job.model["input_shape"] == [3, 32, 32]
    assert job.data["decoder"] == installed_decoder()
    job, bundle = make_bundle(tmp_path, job)
    assert verify_bundle(bundle, job, beacon=bytes(32), samples=2).ok
    other = job.with_updates(data={"decoder": "pillow==0.0.1"})
    with pytest.raises(FormatError) as e:
        load_dataset(other)
    assert e.value.reason == "DECODER_MISMATCH"


def test_cli_refuses_a_bad_token_file_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from dk.cli.app import main

    token_file(tmp_path / "t.bin", text="hello world, hello tokens")
    (tmp_path / "t.bin").write_bytes((tmp_path / "t.bin").read_bytes() + b"\x00")
    (tmp_path / "job.toml").write_text(
        DIMS + '[data]\nkind = "tokens"\npath = "t.bin"\nseq_len = 4\n'
    )
    with pytest.raises(SystemExit) as e:
        main(["train", str(tmp_path / "job.toml"), "--out", str(tmp_path / "run")])
    assert e.value.code == 3
    err = capsys.readouterr().err.strip()
    assert err.startswith("dk: error:") and "whole number of uint16" in err
    assert "\n" not in err and "Traceback" not in err
