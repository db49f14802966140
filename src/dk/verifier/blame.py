"""Data-parallel bundles: the ranks' signatures, and blame by rank (SPEC §11.6, §12.6).

:func:`check_ranks` runs right after the job binding (SPEC §12.2 step 5a). After the replay,
:func:`judge_ranks` compares each challenged interval's committed rank digests with the
replayed ones and names the ranks at fault (``Report.blame``):

* the replay's step digests ``d_{r,t}`` are compared with the bundle's ``ranks/<i>.bin``
  (checked first against the committed ``D_{r,i}``); at the **first** step where any rank's
  message differs every rank started from the same weights, so exactly the ranks whose
  message differs there are blamed;
* when every message matches but the end checkpoint does not, every rank signed a wrong
  checkpoint: all are blamed;
* when ``ranks/<i>.bin`` is missing or does not hash to the committed digests, the evidence
  the bundle's submitter (rank 0) must supply is missing: rank 0 is blamed.

Tolerant mode (:func:`tolerant_blame`, only for intervals outside the tolerance): the
bundle's ``ranks/<i>.msg`` messages must hash to the committed digests (else rank 0); the
verifier follows them and blames the ranks whose message is farther than ``ρ`` from its own
recomputation of their shard gradient at the first step where any is (else every rank).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from dk.crypto.hashing import digests_equal
from dk.crypto.keys import VerifyKey
from dk.pol.parallel import interval_digest
from dk.pol.rank_ext import RANK_MESSAGES_SUFFIX, RANK_STEPS_DIR, rank_signing_digest
from dk.verifier.report import Reason, Report

if TYPE_CHECKING:
    from dk.pol.job import JobSpec
    from dk.verifier.verify import Context

DIGEST = 32


def check_ranks(ctx: Context) -> None:
    """§12.2 step 5a: a data-parallel bundle names the job's ``W`` ranks (rank 0 = the
    worker), every interval carries ``W`` rank digests, and every rank signed the root."""
    job, man = ctx.job, ctx.man
    w = job.world_size
    ranks = (man.ext or {}).get("ranks")
    per_iv = [(iv.ext or {}).get("rank_digests") for iv in man.interval_entries]
    if w == 1:
        if ranks is not None or any(d is not None for d in per_iv) or "rank_signatures" in man.raw:
            ctx.fail("ranks", Reason.TRANSCRIPT_MALFORMED, "a one-rank job's bundle names ranks")
        return
    if ranks is None or len(ranks) != w:
        ctx.fail("ranks", Reason.TRANSCRIPT_MALFORMED, f"the bundle must name the job's {w} ranks")
    if ranks[0]["worker_key"] != man.worker_key.hex():
        ctx.fail("ranks", Reason.TRANSCRIPT_MALFORMED, "rank 0 is not the bundle's worker")
    for i, d in enumerate(per_iv):
        if d is None or len(d) != w:
            ctx.fail(
                "ranks", Reason.TRANSCRIPT_MALFORMED, f"interval {i} needs {w} rank digests", i
            )
    sigs = man.raw.get("rank_signatures")
    if sigs is None or len(sigs) != w:
        ctx.fail("ranks", Reason.RANK_SIGNATURE_INVALID, f"the bundle needs {w} rank signatures")
    for r, (sig, entry) in enumerate(zip(sigs, ranks, strict=True)):
        k = bytes.fromhex(entry["worker_key"])
        digest = rank_signing_digest(man.job_id, man.transcript_root, r, k)
        if not VerifyKey(k).verify(bytes.fromhex(sig), digest):
            ctx.fail("ranks", Reason.RANK_SIGNATURE_INVALID, f"rank {r}'s signature is invalid")
    ctx.rep.passed("ranks")


def read_rank_steps(bundle: Path, i: int, size: int, *, suffix: str = ".bin") -> bytes | None:
    """``ranks/<i>.bin`` if it is a regular file of exactly ``size`` bytes, else ``None``."""
    p = bundle / RANK_STEPS_DIR / f"{i}{suffix}"
    if p.is_symlink() or not p.is_file() or p.stat().st_size != size:
        return None
    with open(p, "rb") as f:
        data = f.read(size + 1)
    return data if len(data) == size else None


def _claimed_steps(
    data: bytes | None, i: int, w: int, n: int, committed: list[str]
) -> list[list[bytes]]:
    """The evidence as per-rank step digests, if it hashes to ``committed`` (else empty)."""
    if data is None or len(data) != w * n * DIGEST:
        return []
    steps = [
        [data[(r * n + s) * DIGEST : (r * n + s + 1) * DIGEST] for s in range(n)] for r in range(w)
    ]
    for r in range(w):
        if interval_digest(i, r, steps[r]).hex() != committed[r]:
            return []
    return steps


def blame_interval(
    i: int,
    committed: list[str],
    replayed: list[list[str]],
    root_ok: bool,
    evidence: bytes | None,
) -> list[int]:
    """The ranks at fault in interval ``i`` (empty: none) by SPEC §12.6.

    Args:
        i: the interval.
        committed: its ``ext.rank_digests``.
        replayed: the replay's step digests per rank (hex, rank-major).
        root_ok: whether the end checkpoint replayed.
        evidence: the bundle's ``ranks/<i>.bin`` bytes, or ``None``.
    """
    w = len(committed)
    rep_steps = [[bytes.fromhex(d) for d in r] for r in replayed]
    rep_digests = [interval_digest(i, r, rep_steps[r]).hex() for r in range(w)]
    if rep_digests == committed:
        return [] if root_ok else list(range(w))
    n = len(rep_steps[0])
    claimed = _claimed_steps(evidence, i, w, n, committed)
    if not claimed:
        return [0]
    for s in range(n):
        bad = [r for r in range(w) if not digests_equal(claimed[r][s], rep_steps[r][s])]
        if bad:
            return bad
    return [0]  # unreachable when the digests differ; rank 0 assembled the evidence


def read_rank_messages(bundle: Path, i: int, size: int) -> bytes | None:
    """Tolerant mode: ``ranks/<i>.msg`` if a regular file of exactly ``size`` bytes."""
    return read_rank_steps(bundle, i, size, suffix=RANK_MESSAGES_SUFFIX)


def committed_messages(
    data: bytes, i: int, a: int, n: int, size: int, committed: list[str]
) -> list[list[bytes]] | None:
    """``ranks/<i>.msg`` as ``[rank][step]`` messages if they hash (SPEC §11.6) to the
    committed ``D_{r,i}`` of interval ``i`` (steps ``a … a+n−1``), else ``None``."""
    from dk.pol.parallel import step_digest
    from dk.pol.parallel_torch import split_messages

    w = len(committed)
    if len(data) != w * n * size:
        return None
    msgs = split_messages(data, w, n, size)
    for r in range(w):
        d = [step_digest(a + s, m) for s, m in enumerate(msgs[r])]
        if interval_digest(i, r, d).hex() != committed[r]:
            return None
    return msgs


def tolerant_blame(
    job: JobSpec, dataset: Any, bundle: Path, iv: Any, start: Any
) -> tuple[list[int], dict[str, Any]]:
    """Blame for a tolerant interval that does not replay within tolerance (SPEC §12.6).

    The bundle's ``ranks/<i>.msg`` must hold ``W · n`` messages that hash to the committed
    ``D_{r,i}``; else rank 0 (the submitter) is blamed. Then the ranks whose message is
    farther than ``ρ`` (SPEC §11.7's loss bound) from the verifier's recomputation of their
    shard gradient, at the first step where any is (following the committed messages); when
    every message is within ``ρ``, every rank (each signed a checkpoint its messages do not
    give).
    """
    from dk.pol.loss import loss_rtol
    from dk.pol.parallel_torch import ParallelTorchSession, blame_tolerant
    from dk.pol.sampler import job_sampler

    w, i = job.world_size, iv.index
    a, b = iv.start_step, iv.end_step
    committed = (iv.ext or {}).get("rank_digests") or []
    session = ParallelTorchSession(job, output_dim=getattr(dataset, "output_dim", None))
    data = read_rank_messages(bundle, i, w * (b - a) * session.message_size)
    if data is None or len(committed) != w:
        return [0], {}
    msgs = committed_messages(data, i, a, b - a, session.message_size, committed)
    if msgs is None:
        return [0], {}
    sampler = job_sampler(job, len(dataset))
    bad, fig = blame_tolerant(session, dataset, sampler, start, msgs, a, b, loss_rtol(job))
    return (bad or list(range(w))), fig


def judge_ranks(
    rep: Report,
    bundle: Path,
    man: Any,
    chal: list[int],
    results: dict[int, tuple[bool, dict[str, Any]]],
    *,
    job: JobSpec | None = None,
    dataset: Any = None,
    held: dict[int, Any] | None = None,
) -> None:
    """Blame by rank for every challenged interval of a data-parallel bundle (SPEC §12.6);
    a tolerant job's (``job``, ``dataset`` and the verified start tensors ``held`` given)
    for the intervals that do not replay within tolerance."""
    ivs = man.interval_entries
    blamed: set[int] = set()
    if job is not None and job.mode == "tolerant":
        assert held is not None
        for i in chal:
            if i in results and not results[i][0]:  # (absent: its replay failed, recorded)
                ranks, fig = tolerant_blame(job, dataset, bundle, ivs[i], held[i])
                blamed.update(ranks)
                if "rank_grad_distance" in fig:
                    rep.figures.setdefault("rank_grad_distance", {})[str(i)] = fig[
                        "rank_grad_distance"
                    ]
        rep.blame = sorted(blamed)
        return
    for i in chal:
        if i not in results:  # its replay failed: the verifier's own trouble, recorded
            continue
        ok, fig = results[i]
        replayed = fig.get("rank_steps")
        if replayed is None:
            continue
        committed = (ivs[i].ext or {}).get("rank_digests") or []
        n = ivs[i].end_step - ivs[i].start_step
        evidence = read_rank_steps(bundle, i, DIGEST * len(committed) * n)
        ranks = blame_interval(i, committed, replayed, ok, evidence)
        if ranks and ok:  # the checkpoint replays but a committed digest does not
            rep.fail(
                "replay",
                Reason.RANK_DIGEST_MISMATCH,
                f"interval {i}: rank(s) {ranks} committed digests that do not replay",
                i,
            )
        blamed.update(ranks)
    rep.blame = sorted(blamed)
