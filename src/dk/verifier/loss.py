"""The committed per-interval training loss, checked (SPEC §11.7).

Two checks: every interval of a job that requires it carries ``ext.loss`` (part of the
structure check, ``LOSS_MISSING``), and the loss of every challenged interval whose weights
replay equals the loss its replay computed (bit for bit in exact mode, within a relative
bound in tolerant mode, ``LOSS_MISMATCH``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from dk.pol.loss import LOSS_KEY, loss_close, loss_required, loss_rtol
from dk.pol.transcript import Manifest, ManifestInterval
from dk.verifier.report import Reason, Report

if TYPE_CHECKING:
    from dk.pol.job import JobSpec
    from dk.verifier.verify import Context

__all__ = ["check_loss_present", "judge_losses", "loss_finding"]


def check_loss_present(ctx: Context) -> None:
    """SPEC §11.7: ``ext.loss`` on every interval when the job requires it, none in zk mode."""
    need, forbidden = loss_required(ctx.job), ctx.job.mode == "zk"
    for iv in ctx.man.interval_entries:
        has = iv.ext is not None and LOSS_KEY in iv.ext
        if need and not has:
            ctx.fail(
                "structure", Reason.LOSS_MISSING, f"interval {iv.index} commits no loss", iv.index
            )
        if has and forbidden:
            ctx.fail(
                "structure",
                Reason.LOSS_MISMATCH,
                f"interval {iv.index} commits a loss that a {ctx.job.mode}-mode job cannot check",
                iv.index,
            )


def loss_finding(
    job: JobSpec, iv: ManifestInterval, fig: dict[str, Any]
) -> tuple[Reason, str] | None:
    """Why interval ``iv``'s claimed loss is not its replayed ``fig["loss"]``, or ``None``."""
    has = iv.ext is not None and LOSS_KEY in iv.ext
    if not loss_required(job):
        if has and job.mode == "zk":
            return Reason.LOSS_MISMATCH, f"interval {iv.index} commits a loss the job cannot check"
        return None
    if not has:
        return Reason.LOSS_MISSING, f"interval {iv.index} commits no loss"
    assert iv.ext is not None
    claimed, replayed = float(iv.ext[LOSS_KEY]), float(fig.get("loss", float("nan")))
    if loss_close(job, claimed, replayed):
        return None
    bound = "" if job.mode != "tolerant" else f", relative bound {loss_rtol(job):g}"
    return Reason.LOSS_MISMATCH, (
        f"interval {iv.index} claims training loss {claimed!r}; its replay gives "
        f"{replayed!r}{bound}"
    )


def judge_losses(
    rep: Report,
    job: JobSpec,
    man: Manifest,
    chal: list[int],
    results: dict[int, tuple[bool, dict[str, Any]]],
) -> None:
    """Record ``LOSS_MISMATCH`` for each challenged interval whose weights replay but whose
    loss does not (an interval whose weights do not replay is already rejected)."""
    ivs = man.interval_entries
    worst = 0.0
    for i in chal:
        if i not in results:  # its replay failed: the verifier's own trouble, recorded
            continue
        ok, fig = results[i]
        if not ok:
            continue
        bad = loss_finding(job, ivs[i], fig)
        if bad is not None:
            rep.fail("replay", *bad, i)
        ext = ivs[i].ext
        if "loss" in fig and ext is not None and LOSS_KEY in ext and job.mode == "tolerant":
            r = float(fig["loss"])
            worst = max(worst, abs(float(ext[LOSS_KEY]) - r) / max(abs(r), 1e-300))
    if job.mode == "tolerant" and loss_required(job):
        rep.figures["max_loss_rel_diff"] = worst
