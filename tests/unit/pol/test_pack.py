"""The run directory's blob pack (dk.pol.pack, SPEC §11.8): torn tails are cut back on resume,
damaged records are refused (never proved), and runs recorded before packs still prove."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import pytest
from tests.helpers import WORKER, tiny_job

from dk.errors import FormatError
from dk.pol import train_job
from dk.pol.checkpoint import write_blob
from dk.pol.pack import HEADER_BYTES, PACK_MAGIC, PACK_NAME, RunBlobs
from dk.pol.run import read_run
from dk.prover import prove_run


def _bundle_bytes(bundle: Path) -> dict[str, bytes]:
    return {
        p.relative_to(bundle).as_posix(): p.read_bytes()
        for p in sorted(bundle.rglob("*"))
        if p.is_file()
    }


@pytest.fixture(scope="module")
def whole(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Path, dict[str, bytes]]:
    """A complete packed run of :func:`tiny_job` and the bytes of its bundle."""
    d = tmp_path_factory.mktemp("whole")
    job = tiny_job()
    train_job(job, d / "run")
    return job, d / "run", _bundle_bytes(prove_run(d / "run", job, WORKER, d / "bundle"))


def _copy(run: Path, dst: Path) -> Path:
    shutil.copytree(run, dst)
    return dst


def _record_offsets(run: Path) -> list[int]:
    """Offsets of the records of a run's pack, in checkpoint order (from run.json)."""
    pos, out = len(PACK_MAGIC), []
    for c in read_run(run).checkpoints:
        out.append(pos)
        pos += HEADER_BYTES + c.nbytes
    return out


def _interrupt(run: Path, keep: int) -> None:
    """Make ``run`` an interrupted run whose log names its first ``keep`` checkpoints."""
    (run / "run.json").unlink()
    log = (run / "run.log.jsonl").read_text().splitlines(keepends=True)
    (run / "run.log.jsonl").write_text("".join(log[:keep]))


def test_the_pack_is_the_run_s_blob_store(whole: tuple[Any, Path, dict[str, bytes]]) -> None:
    _, run, bundle = whole
    assert (run / PACK_NAME).is_file() and not (run / "blobs").exists()
    info = read_run(run)
    offsets = _record_offsets(run)
    assert (run / PACK_NAME).stat().st_size == offsets[-1] + HEADER_BYTES + info.checkpoints[
        -1
    ].nbytes
    data = (run / PACK_NAME).read_bytes()
    for c, off in zip(info.checkpoints, offsets, strict=True):  # the bundle's bytes, packed
        blob = data[off + HEADER_BYTES : off + HEADER_BYTES + c.nbytes]
        assert bundle[f"blobs/{c.root}.safetensors"] == blob


@pytest.mark.parametrize("tail", ["torn", "whole-unlogged"])
def test_resume_cuts_the_pack_back_to_its_log(
    whole: tuple[Any, Path, dict[str, bytes]], tmp_path: Path, tail: str
) -> None:
    """Records past the log's last (torn, or whole but never logged) are dropped on resume;
    the resumed run proves byte for byte as the uninterrupted one."""
    job, run0, bundle = whole
    run = _copy(run0, tmp_path / "run")
    offsets = _record_offsets(run)
    _interrupt(run, keep=2)
    if tail == "torn":  # the third record cut off mid-blob
        os.truncate(run / PACK_NAME, offsets[2] + HEADER_BYTES + 10)
    else:  # records 2 and 3 whole, their lines lost
        os.truncate(run / PACK_NAME, offsets[4])
    info = train_job(job, run, resume=True)
    assert info.complete and len(info.checkpoints) == len(job.checkpoint_steps())
    assert (run / PACK_NAME).stat().st_size == (run0 / PACK_NAME).stat().st_size
    assert _bundle_bytes(prove_run(run, job, WORKER, tmp_path / "bundle")) == bundle


def _flip(path: Path, at: int) -> None:
    with open(path, "r+b") as f:
        f.seek(at)
        b = f.read(1)
        f.seek(at)
        f.write(bytes([b[0] ^ 0x01]))


@pytest.mark.parametrize("where", ["data", "header-magic", "header-size"])
def test_a_damaged_record_is_never_proved(
    whole: tuple[Any, Path, dict[str, bytes]], tmp_path: Path, where: str
) -> None:
    job, run0, _ = whole
    run = _copy(run0, tmp_path / "run")
    off = _record_offsets(run)[2]
    if where == "data":  # the last byte of the blob: a tensor's data
        _flip(run / PACK_NAME, _record_offsets(run)[3] - 1)
        match = "does not hash to its root"
    elif where == "header-magic":
        _flip(run / PACK_NAME, off)
        match = "damaged at byte"
    else:  # a size the run does not list: the walk goes astray from there
        _flip(run / PACK_NAME, off + 8)
        match = "damaged at byte|bytes, the run lists"
    with pytest.raises(FormatError, match=match):
        prove_run(run, job, WORKER, tmp_path / "bundle")
    assert not (tmp_path / "bundle" / "manifest.json").exists()


def test_a_damaged_record_is_refused_by_the_cli(
    whole: tuple[Any, Path, dict[str, bytes]], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``dk prove``: one line, exit 3 (malformed input), no traceback, no bundle."""
    from dk.cli.app import main

    job, run0, _ = whole
    run = _copy(run0, tmp_path / "run")
    _flip(run / PACK_NAME, _record_offsets(run)[1] - 1)
    (tmp_path / "job.toml").write_text(job.to_toml())
    with pytest.raises(SystemExit) as e:
        main(["keygen", "--out", str(tmp_path / "k")])
    assert e.value.code in (0, None)
    capsys.readouterr()
    job_toml, key, out = tmp_path / "job.toml", tmp_path / "k", tmp_path / "bundle"
    with pytest.raises(SystemExit) as e:
        main(["prove", str(run), "--job", str(job_toml), "--key", str(key), "--out", str(out)])
    err = capsys.readouterr().err
    assert e.value.code == 3, err
    assert "does not hash to its root" in err and len(err.strip().splitlines()) == 1, err
    assert not (out / "manifest.json").exists()


def test_damage_is_refused_by_export_and_resume(
    whole: tuple[Any, Path, dict[str, bytes]], tmp_path: Path
) -> None:
    from dk.pol.export import export_weights

    job, run0, _ = whole
    run = _copy(run0, tmp_path / "run")
    size = (run / PACK_NAME).stat().st_size
    _flip(run / PACK_NAME, size - 1)  # the last checkpoint's data
    with pytest.raises(FormatError, match="does not hash to its root"):
        export_weights(run, tmp_path / "w.safetensors")
    _interrupt(run, keep=len(job.checkpoint_steps()))
    with pytest.raises(FormatError, match="is corrupt"):
        train_job(job, run, resume=True)


def _to_old_layout(run: Path) -> None:
    """Rewrite a packed run as dk wrote runs before packs: one file per blob, no pack."""
    blobs = RunBlobs(run)
    for c in read_run(run).checkpoints:
        ck = blobs.checkpoint(bytes.fromhex(c.root), c.nbytes)
        _, _, n = write_blob(run, ck)
        assert n == c.nbytes
    (run / PACK_NAME).unlink()


def test_a_run_recorded_before_packs_still_proves_and_exports(
    whole: tuple[Any, Path, dict[str, bytes]], tmp_path: Path
) -> None:
    from dk.pol.export import export_weights

    job, run0, bundle = whole
    run = _copy(run0, tmp_path / "run")
    _to_old_layout(run)
    assert _bundle_bytes(prove_run(run, job, WORKER, tmp_path / "bundle")) == bundle
    assert export_weights(run, tmp_path / "w.safetensors")["step"] == job.steps


def test_a_run_recorded_before_packs_resumes(
    whole: tuple[Any, Path, dict[str, bytes]], tmp_path: Path
) -> None:
    """Its first blobs are files, the rest go to a new pack; the bundle is the same."""
    job, run0, bundle = whole
    run = _copy(run0, tmp_path / "run")
    _to_old_layout(run)
    for c in read_run(run).checkpoints[3:]:  # nothing after the log's last survives
        (run / "blobs" / f"{c.root}.safetensors").unlink()
    _interrupt(run, keep=3)
    train_job(job, run, resume=True)
    assert len(RunBlobs(run).index()) == len(job.checkpoint_steps()) - 3
    assert _bundle_bytes(prove_run(run, job, WORKER, tmp_path / "bundle")) == bundle
