"""Verify many bundles at once (``dk verify-many``): one report each, on one executor.

With a :class:`~dk.verifier.executors.RayExecutor` every bundle's whole verification is one
Ray task (the bundle directories must be readable from the Ray nodes: one machine, or a shared
path); without one they run one after the other in this process. Each report is what
:func:`verify_bundle` gives for that bundle alone, with the same digest.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dk.errors import FormatError
from dk.verifier.report import Report
from dk.verifier.verify import verify_bundle

if TYPE_CHECKING:
    from dk.pol.job import JobSpec


def bundle_dirs(root: str | os.PathLike[str]) -> list[Path]:
    """The bundles under ``root``: its sub-directories holding a ``manifest.json``, sorted.

    Raises:
        FormatError: there is none (a run of zero verifications is a mistake, not a success;
            ``root`` itself being one bundle is named in the message).
    """
    base = Path(root)
    found = sorted(p for p in base.iterdir() if p.is_dir() and (p / "manifest.json").is_file())
    if not found:
        hint = (
            "; it is one bundle itself: use dk verify" if (base / "manifest.json").is_file() else ""
        )
        raise FormatError(f"no bundle under {base} (sub-directories holding manifest.json){hint}")
    return found


def _one(
    bundle: str, job: JobSpec | str | os.PathLike[str], kwargs: dict[str, Any]
) -> dict[str, Any]:
    """Ray task body: verify one bundle; the report crosses back as its dict."""
    return verify_bundle(bundle, job, **kwargs).to_dict()


def verify_many(
    root: str | os.PathLike[str],
    job: JobSpec | str | os.PathLike[str],
    *,
    executor: Any = None,
    **kwargs: Any,
) -> list[tuple[str, dict[str, Any]]]:
    """Verify every bundle under ``root`` against ``job``; ``[(name, report dict)]`` in order.

    Args:
        root: a directory of bundle directories.
        job: the job they were all proved for (a JobSpec or the path of ``job.toml``).
        executor: ``None`` (here, one after the other) or a RayExecutor (one task per bundle).
        **kwargs: passed to :func:`verify_bundle` for every bundle (``beacon``, ``samples``…).
    """
    bundles = bundle_dirs(root)
    if executor is None:
        return [(b.name, verify_bundle(b, job, **kwargs).to_dict()) for b in bundles]
    ray = executor._ray
    task = ray.remote(_one).options(num_cpus=1, max_retries=executor.retries)
    job_arg = str(Path(job).resolve()) if isinstance(job, str | os.PathLike) else job
    futures = [(b.name, task.remote(str(b.resolve()), job_arg, kwargs)) for b in bundles]
    out = []
    for name, fut in futures:
        try:
            out.append((name, ray.get(fut)))
        except Exception as e:  # the verifier's machine fell short: inconclusive, not reject
            rep = Report()
            from dk.verifier.report import Reason

            rep.fail("executor", Reason.EXECUTOR_FAILED, f"{type(e).__name__} on Ray")
            out.append((name, rep.to_dict()))
    return out


def summary(results: list[tuple[str, dict[str, Any]]]) -> dict[str, Any]:
    """Counts by verdict and one row per bundle (what ``dk verify-many`` prints)."""
    rows = [
        {
            "bundle": name,
            "verdict": r["verdict"],
            "reasons": ",".join(r["reasons"]),
            "challenged": len(r["challenged"]),
            "digest": r["digest"][:16],
        }
        for name, r in results
    ]
    counts = {
        v: sum(1 for r in rows if r["verdict"] == v) for v in ("accept", "reject", "inconclusive")
    }
    return {"bundles": len(rows), **counts, "rows": rows}
