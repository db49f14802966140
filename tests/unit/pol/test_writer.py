"""The commit pipeline (dk.pol.writer): in order, bounded, errors surface, nothing claimed early."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import dk.pol.writer as writer
from dk.pol.checkpoint import blob_name, checkpoint_root, update_norm
from dk.pol.pack import RunBlobs
from dk.pol.run import RunInfo
from dk.pol.sampler import Sampler
from dk.pol.writer import CommitWriter


def _ck(step: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(step)
    return {
        "model/w": rng.standard_normal((4, 3)).astype(np.float32),
        "meta/step": np.array(step, dtype=np.int64),
    }


def _writer(
    tmp_path: Path, depth: int = 2, batch_bytes: int = 0, inline_bytes: int = writer.INLINE_BYTES
) -> CommitWriter:
    info = RunInfo(job_id="00" * 32, data_root="00" * 32, interval=2, steps=6)
    sampler = Sampler(seed=1, n=20, batch_size=4)
    return CommitWriter(
        tmp_path, info, sampler, depth=depth, batch_bytes=batch_bytes, inline_bytes=inline_bytes
    )


INLINE = pytest.mark.parametrize("inline_bytes", [0, writer.INLINE_BYTES], ids=["thread", "inline"])


@INLINE
@pytest.mark.parametrize("batch_bytes", [0, 200, 1 << 20])  # one at a time, 3, all at once
def test_commits_in_order_with_intervals(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, batch_bytes: int, inline_bytes: int
) -> None:
    monkeypatch.setattr(writer, "BATCH_WAIT_S", 60.0)  # partial batches: at close
    w = _writer(tmp_path, batch_bytes=batch_bytes, inline_bytes=inline_bytes)
    w.start()
    cks = [_ck(s) for s in (0, 2, 4, 6)]
    for i, ck in enumerate(cks):
        w.put(i, 2 * i, ck)
    written = w.close()
    info = w.info
    assert [c.root for c in info.checkpoints] == [checkpoint_root(c).hex() for c in cks]
    assert written == [tmp_path / "blobs.pack", w.log_path]  # small blobs: packed
    assert all(p.is_file() for p in written)
    blobs = RunBlobs(tmp_path)
    for c, ck in zip(info.checkpoints, cks, strict=True):
        got = blobs.checkpoint(bytes.fromhex(c.root), c.nbytes)
        assert got.keys() == ck.keys() and all((got[k] == ck[k]).all() for k in ck)
    sampler = Sampler(seed=1, n=20, batch_size=4)
    for i, iv in enumerate(info.intervals):
        assert (iv.start_step, iv.end_step) == (2 * i, 2 * i + 2)
        assert iv.update_norm == update_norm(cks[i], cks[i + 1])
        assert iv.batch_commitment == sampler.batch_commitment(i, 2 * i, 2 * i + 2).hex()
    lines = [json.loads(x) for x in w.log_path.read_text().splitlines()]
    assert [x["checkpoint"]["root"] for x in lines] == [c.root for c in info.checkpoints]
    assert [x.get("interval", {}).get("index") for x in lines] == [None, 0, 1, 2]
    # which path committed: the thread for "large" checkpoints and for a batch never filled
    # (B = 32 > 4, committed at close); the filling put for small ones
    if inline_bytes > 0 and batch_bytes < 1 << 20:
        assert w.batches["inline"] > 0
    else:
        assert w.batches["inline"] == 0 and w.batches["thread"] > 0


@INLINE
def test_a_commit_error_surfaces_and_nothing_unwritten_is_logged(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, inline_bytes: int
) -> None:
    real = writer.encode_blob_parts
    calls = []

    def failing(tensors: object) -> object:
        calls.append(1)
        if len(calls) == 2:
            raise OSError("disk full")
        return real(tensors)  # type: ignore[arg-type]

    monkeypatch.setattr(writer, "encode_blob_parts", failing)
    monkeypatch.setattr(writer, "BATCH_WAIT_S", 60.0)  # inline: no commit by the thread
    w = _writer(tmp_path, inline_bytes=inline_bytes)
    w.start()
    cks = [_ck(2 * i) for i in range(50)]
    raised_at = None
    with pytest.raises(OSError, match="disk full"):  # at a later put, or at close
        for i in range(50):
            raised_at = i
            w.put(i, 2 * i, cks[i])
        raised_at = None
        w.close()
    if inline_bytes:  # by the put whose commit failed, on the training thread
        assert raised_at == 1 and w.batches == {"inline": 1, "thread": 0}
    with pytest.raises(OSError, match="disk full"):
        w.close()
    lines = [json.loads(x) for x in w.log_path.read_text().splitlines()]
    assert len(lines) == 1  # only the checkpoint whose blob is whole
    blobs = RunBlobs(tmp_path)
    assert list(blobs.index()) == [bytes.fromhex(lines[0]["checkpoint"]["root"])]
    assert blobs.damaged_at is None and blobs.end == (tmp_path / "blobs.pack").stat().st_size


def test_the_queue_is_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A producer faster than the thread waits: at most ``depth`` snapshots queue up."""
    gate = threading.Event()
    real = writer.encode_blob_parts

    def slow(*a: object, **kw: object) -> object:
        gate.wait(10)
        return real(*a, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(writer, "encode_blob_parts", slow)
    w = _writer(tmp_path, depth=2, inline_bytes=0)  # every checkpoint "large": the thread
    w.start()
    done = []
    t = threading.Thread(
        target=lambda: [w.put(i, 2 * i, _ck(2 * i)) for i in range(6)] + [done.append(1)]
    )
    t.start()
    t.join(0.5)
    assert not done and w.pending() == 2  # one being written, two waiting, producer blocked
    gate.set()
    t.join(10)
    assert done
    w.close()
    assert len(w.info.checkpoints) == 6


@INLINE
def test_a_batch_that_is_not_full_is_committed_soon(tmp_path: Path, inline_bytes: int) -> None:
    """Batched checkpoints reach the log within ``BATCH_WAIT_S`` (a crash loses little), small
    ones too, though the thread never commits their full batches."""
    import time

    w = _writer(tmp_path, batch_bytes=1 << 20, inline_bytes=inline_bytes)
    w.start()
    cks = [_ck(0), _ck(2)]
    w.put(0, 0, cks[0])
    w.put(1, 2, cks[1])
    deadline = time.monotonic() + 10 * writer.BATCH_WAIT_S + 5
    while len(w.log_path.read_text().splitlines()) < 2 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert len(w.log_path.read_text().splitlines()) == 2
    assert w._batch == writer.MAX_BATCH  # the batch was not full
    w.close()
    assert w.batches["inline"] == 0 and w.batches["thread"] >= 1  # the thread, before close


def test_small_checkpoints_are_committed_on_the_training_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A full batch of small checkpoints is committed by the ``put`` that fills it (no GIL
    hand-over to another thread); large ones on the thread. The same log either way."""
    real = writer.encode_blob_parts
    seen: list[str] = []

    def spy(tensors: object) -> object:
        seen.append(threading.current_thread().name)
        return real(tensors)  # type: ignore[arg-type]

    monkeypatch.setattr(writer, "encode_blob_parts", spy)
    monkeypatch.setattr(writer, "BATCH_WAIT_S", 60.0)  # the thread commits no partial batch
    logs = []
    here = threading.current_thread().name
    for inline_bytes, where in ((writer.INLINE_BYTES, here), (0, "dk-commit")):
        seen.clear()
        run = tmp_path / str(inline_bytes)
        w = _writer(run, batch_bytes=200, inline_bytes=inline_bytes)  # 3 per batch
        w.start()
        for i in range(6):
            w.put(i, 2 * i, _ck(2 * i))
        w.close()
        assert seen == [where] * 6
        inline, thread = w.batches["inline"], w.batches["thread"]
        assert (inline, thread) == (2, 0) if where == here else inline == 0 < thread
        logs.append(w.log_path.read_bytes())
    assert logs[0] == logs[1]


def test_a_new_blob_never_writes_through_an_existing_file(tmp_path: Path) -> None:
    """A blob hard-linked into a bundle (or torn by a crash) is replaced, never written into."""
    import os

    from dk.pol.checkpoint import write_blob

    ck = _ck(3)
    root = checkpoint_root(ck)
    (tmp_path / "blobs").mkdir()
    path = tmp_path / blob_name(root)
    path.write_bytes(b"torn")
    os.link(path, tmp_path / "linked")
    _, got, n = write_blob(tmp_path, ck, root, durable=False)
    assert got == path and path.stat().st_size == n and path.read_bytes() != b"torn"
    assert (tmp_path / "linked").read_bytes() == b"torn"  # the other link is untouched
    path.unlink()
    write_blob(tmp_path, ck, root, durable=False)  # new: created in place
    assert checkpoint_root(ck) == root and path.stat().st_size == n


def _model_ck(rng: np.random.Generator, shapes: dict[str, tuple[int, ...]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, shape in shapes.items():
        if name.endswith("count"):
            out[f"model/{name}"] = rng.integers(0, 1 << 40, shape).astype(np.int64)
        else:  # wide exponents: summation order changes the last bits here
            v = rng.standard_normal(shape) * np.exp2(rng.integers(-30, 30, shape))
            out[f"model/{name}"] = v.astype(np.float32)
    out["optim/lr"] = np.array(0.1)
    return out


def test_batched_update_norms_have_the_bits_of_one_at_a_time() -> None:
    """SPEC §1.4 / §11.1: the batch's fold sums make the same additions, so the same bits."""
    rng = np.random.default_rng(2)
    for trial in range(30):
        shapes = {
            f"t{i}" + ("count" if i == 0 and trial % 3 == 0 else ""): tuple(
                int(d) for d in rng.integers(0, 40, int(rng.integers(0, 3)))
            )
            for i in range(int(rng.integers(1, 6)))
        }
        chain = [_model_ck(rng, shapes) for _ in range(int(rng.integers(3, 12)))]
        got = writer.update_norms(chain)
        want = [update_norm(a, b) for a, b in zip(chain, chain[1:], strict=False)]
        assert got is not None and [x.hex() for x in got] == [x.hex() for x in want]
    other = _model_ck(rng, {"t0": (3,)})
    assert writer.update_norms([other, other, _model_ck(rng, {"t0": (4,)})]) is None
    assert writer.update_norms([other, _model_ck(rng, {"t9": (3,)}), other]) is None
    assert writer.update_norms([other, other]) is None  # one interval: computed alone


def test_a_log_that_cannot_be_closed_is_the_error_and_abort_drops_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The log's last flush failing at close is raised by ``close`` (abort drops it); the pack
    is closed either way."""

    class FullLog:
        def __init__(self, real: Any) -> None:
            self.real = real

        def write(self, text: str) -> int:
            return int(self.real.write(text))

        def flush(self) -> None:
            self.real.flush()

        def close(self) -> None:
            self.real.close()
            raise OSError("no space left on device")

    for aborting in (False, True):
        w = _writer(tmp_path / str(aborting))
        w.start()
        w._log = FullLog(w._log)
        w.put(0, 0, _ck(0))
        if aborting:
            w.abort()
        else:
            with pytest.raises(OSError, match="no space"):
                w.close()
        assert w._pack is not None and w._pack._fd < 0  # closed
