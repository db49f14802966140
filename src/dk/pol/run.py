"""The run directory a worker's training leaves behind (input of ``dk prove``).

Layout::

    RUN/run.json          summary, written atomically when training completes
    RUN/run.log.jsonl     one line per committed checkpoint, appended as training goes
    RUN/blobs.pack        small checkpoint blobs, appended (dk.pol.pack, SPEC §11.8)
    RUN/blobs/<root>.safetensors   larger blobs (and all blobs of runs from before packs)

A crash leaves ``run.log.jsonl`` and every blob it names intact; ``dk prove`` refuses an
incomplete run.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from dk.crypto.canonical_json import parse_json
from dk.errors import FormatError

RUN_FORMAT = "dk-run"
RUN_VERSION = 1
MAX_RUN_JSON = 64 * 1024 * 1024


@dataclass
class CheckpointEntry:
    """One committed checkpoint."""

    index: int
    step: int
    root: str
    nbytes: int


@dataclass
class IntervalEntry:
    """One interval (steps ``start_step .. end_step - 1``) and its metadata."""

    index: int
    start_step: int
    end_step: int
    batch_commitment: str
    update_norm: float
    ext: dict[str, Any] | None = None  # the interval's ``ext`` object (SPEC §11.5), if any


@dataclass
class RunInfo:
    """What a run committed."""

    job_id: str
    data_root: str
    interval: int
    steps: int
    checkpoints: list[CheckpointEntry] = field(default_factory=list)
    intervals: list[IntervalEntry] = field(default_factory=list)
    complete: bool = False
    ext: dict[str, Any] | None = None  # the run's ``ext`` object (SPEC §11.5), if any

    def to_dict(self) -> dict[str, Any]:
        """``asdict(self)`` plus format and version (entries as shallow dicts: their fields
        are plain numbers and strings, so no deep copy is needed)."""
        d = {f.name: getattr(self, f.name) for f in fields(self)}
        d["checkpoints"] = [dict(c.__dict__) for c in self.checkpoints]
        d["intervals"] = [dict(i.__dict__) for i in self.intervals]
        d["format"], d["version"] = RUN_FORMAT, RUN_VERSION
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> RunInfo:
        if d.get("format") != RUN_FORMAT or d.get("version") != RUN_VERSION:
            raise FormatError("not a dk run directory (bad run.json format/version)")
        try:
            return cls(
                job_id=d["job_id"],
                data_root=d["data_root"],
                interval=d["interval"],
                steps=d["steps"],
                complete=bool(d["complete"]),
                checkpoints=[CheckpointEntry(**c) for c in d["checkpoints"]],
                intervals=[IntervalEntry(**i) for i in d["intervals"]],
                ext=d.get("ext"),
            )
        except (KeyError, TypeError) as e:
            raise FormatError(f"run.json is malformed: {e}") from None


def atomic_write(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` via a temporary file and rename."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_run(run_dir: Path, info: RunInfo) -> None:
    """Write ``run.json`` atomically (compact JSON: the C encoder; indenting is 10x slower,
    and its circular-reference check 5x: the summary is plain numbers and strings)."""
    atomic_write(run_dir / "run.json", json.dumps(info.to_dict(), check_circular=False).encode())


def read_run(run_dir: str | Path) -> RunInfo:
    """Read a run directory's ``run.json``."""
    p = Path(run_dir) / "run.json"
    if not p.is_file():
        log = Path(run_dir) / "run.log.jsonl"
        if log.is_file():
            raise FormatError(f"run {run_dir} is incomplete (training did not finish)")
        raise FormatError(f"not a run directory (no run.json): {run_dir}")
    with open(p, "rb") as f:
        data = f.read(MAX_RUN_JSON + 1)
    return RunInfo.from_dict(parse_json(data, limit=MAX_RUN_JSON, what="run.json"))
