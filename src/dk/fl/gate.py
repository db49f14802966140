"""The coordinator's PoL gate: verify a client's round update before it is aggregated (SPEC §VII.1).

A client's fit result carries its new weights and, in Flower's metrics, ``bundle`` (packed
bundle bytes, :mod:`dk.fl.wire`) and ``data_root`` (hex). The coordinator re-derives the client's
round job from the template, the global weights it sent and the claimed data root; the verifier
replays sampled intervals on its copy of the client's data (``data_for(data_root)``: the party
the client lets see its data). An update is aggregated only when the bundle verifies *and* the
returned weights equal the bundle's final checkpoint bit for bit.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from dk.crypto.hashing import digests_equal
from dk.errors import FormatError
from dk.fl.rounds import Weights, round_job
from dk.fl.wire import unpack_bundle
from dk.pol.checkpoint import checkpoint_root, model_tensors, parse_blob, read_blob_file
from dk.pol.job import JobSpec
from dk.pol.transcript import parse_manifest

# Reason codes of the gate itself (the verifier's own codes pass through unchanged).
BUNDLE_MISSING = "BUNDLE_MISSING"
BUNDLE_MALFORMED = "BUNDLE_MALFORMED"
DATA_UNAVAILABLE = "DATA_UNAVAILABLE"  # the coordinator cannot see the data: inconclusive
UPDATE_MISMATCH = "UPDATE_MISMATCH"


@dataclass
class ClientVerdict:
    """The gate's outcome for one client in one round."""

    client: str
    ok: bool
    codes: list[str] = field(default_factory=list)
    detail: str = ""
    worker_key: str = ""

    def to_dict(self) -> dict[str, Any]:
        """JSON form for the round report."""
        return {
            "client": self.client,
            "ok": self.ok,
            "codes": self.codes,
            "detail": self.detail,
            "worker_key": self.worker_key,
        }


@dataclass
class ProvenUpdate:
    """What a verified bundle proves: the round job, the worker and the final weights."""

    job_id: bytes
    worker_key: str
    final_root: bytes
    weights: Weights


def check_bundle(
    template: JobSpec,
    *,
    round_index: int,
    weights_path: Path,
    metrics: Mapping[str, Any],
    data_for: Callable[[str], Path | None],
    beacon: bytes | None = None,
    samples: int | None = None,
) -> tuple[ClientVerdict, ProvenUpdate | None]:
    """Steps 1, 3 and 4 of the gate (SPEC §VII.1): the client's bundle verifies for its round
    job; returns the verdict and, when it passed, what the bundle proves. Never raises on a
    client's bad input."""
    name = str(metrics.get("client", "?"))[:64]
    bundle, root = metrics.get("bundle"), metrics.get("data_root")
    if not isinstance(bundle, bytes) or not isinstance(root, str) or len(root) != 64:
        msg = "no bundle or data root in the update"
        return ClientVerdict(name, False, [BUNDLE_MISSING], msg), None
    data_path = data_for(root)
    if data_path is None:
        return ClientVerdict(name, False, [DATA_UNAVAILABLE], "no verifier copy of this data"), None
    from dk.verifier import verify_bundle

    tmp = Path(tempfile.mkdtemp(prefix="dk-fl-"))
    try:
        try:
            bdir = unpack_bundle(bundle, tmp / "bundle")
            job = round_job(
                template,
                round_index=round_index,
                weights_path=weights_path,
                data_path=data_path,
                data_root=root,
            )
        except FormatError as e:
            return ClientVerdict(name, False, [BUNDLE_MALFORMED], str(e)), None
        rep = verify_bundle(
            bdir, job, beacon=beacon if beacon is not None else os.urandom(32), samples=samples
        )
        if not rep.ok:
            return ClientVerdict(name, False, list(rep.codes), _first_detail(rep)), None
        m = parse_manifest((bdir / "manifest.json").read_bytes()).raw
        worker = str(m["worker_key"])
        last = m["checkpoints"][-1]
        try:  # the challenge need not have fetched it: read it here, against its root
            tensors = parse_blob(read_blob_file(bdir / last["blob"]))
            if not digests_equal(checkpoint_root(tensors), bytes.fromhex(str(last["root"]))):
                raise FormatError(
                    "the last checkpoint does not hash to its committed root",
                    reason="COMMITMENT_MISMATCH",
                )
        except FormatError as e:
            code = e.reason or "BLOB_MALFORMED"
            return ClientVerdict(name, False, [code], f"last checkpoint: {e}"), None
        final = model_tensors(tensors)
        proven = ProvenUpdate(job.job_id, worker, bytes.fromhex(str(last["root"])), final)
        return ClientVerdict(name, True, [], "", worker), proven
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def verify_update(
    template: JobSpec,
    *,
    round_index: int,
    weights_path: Path,
    new_weights: Weights,
    metrics: Mapping[str, Any],
    data_for: Callable[[str], Path | None],
    beacon: bytes | None = None,
    samples: int | None = None,
) -> ClientVerdict:
    """Verify one client's update (all five steps of SPEC §VII.1); never raises on a client's
    bad input.

    Args:
        template: the consumer's job.
        round_index: the round the update answers.
        weights_path: the global weights the coordinator sent this round.
        new_weights: the weights the client returned.
        metrics: the client's fit metrics (``bundle``, ``data_root``, ``client``).
        data_for: the coordinator's copy of the data with a given root, or None.
        beacon: challenge entropy fixed after the client committed (default: fresh 32 bytes).
        samples: intervals to replay (default: the verifier's policy).
    """
    verdict, proven = check_bundle(
        template,
        round_index=round_index,
        weights_path=weights_path,
        metrics=metrics,
        data_for=data_for,
        beacon=beacon,
        samples=samples,
    )
    if proven is None:
        return verdict
    final = proven.weights
    same = set(final) == set(new_weights) and all(
        final[k].dtype == v.dtype and np.array_equal(final[k], v) for k, v in new_weights.items()
    )
    if not same:
        return ClientVerdict(
            verdict.client,
            False,
            [UPDATE_MISMATCH],
            "weights differ from the proven final checkpoint",
            verdict.worker_key,
        )
    return verdict


def _first_detail(rep: Any) -> str:
    reasons = getattr(rep, "reasons", [])
    return str(getattr(reasons[0], "message", "")) if reasons else ""
