"""What a party sends that the market must refuse, over HTTP (SPEC V §2, §5.1, §9): a submit
before its bundle reached the server, bodies and queries that gave HTTP 500."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")
pytest.importorskip("httpx")

from market_support import Clock, key, make_bundle, running
from test_server import JOB, clients, make_service, run_to_matched

from dk.errors import FormatError
from dk.market import bundle_commitment
from dk.market.client import RemoteMarket
from dk.market.errors import MarketRefused
from dk.market.requests import sign_request


@pytest.fixture
def remote(tmp_path: Path) -> Iterator[RemoteMarket]:
    with running(make_service(tmp_path, Clock())) as url, RemoteMarket(url) as rm:
        yield rm


def _matched(rm: RemoteMarket) -> tuple[dict, str]:
    c = clients(rm.market_id)
    return c, run_to_matched(rm, c)


def test_a_submit_needs_its_bundle_on_the_server(remote: RemoteMarket, tmp_path: Path) -> None:
    """SPEC V §5.1: a worker that could commit without delivering would see the beacon and
    withhold a bundle it knows is caught, and the timed-out order gave its stake back."""
    c, oid = _matched(remote)
    bundle = make_bundle(tmp_path / "b", JOB.job_id, c["worker"].account)
    submit = c["worker"].request("submit", order_id=oid, **bundle_commitment(bundle))
    with pytest.raises(MarketRefused) as e:
        remote.execute(submit)
    assert e.value.reason == "BUNDLE_UNKNOWN"
    other = make_bundle(tmp_path / "o", JOB.job_id, c["consumer"].account)  # another key
    remote.upload_bundle(other)
    with pytest.raises(MarketRefused) as e:
        remote.execute(c["worker"].request("submit", order_id=oid, **bundle_commitment(other)))
    assert e.value.reason == "BUNDLE_MISMATCH"
    remote.upload_bundle(bundle)
    assert remote.execute(submit)["order_id"] == oid
    assert remote.show(oid)["state"] == "submitted"


def test_bodies_and_queries_that_gave_500_are_refused(remote: RemoteMarket) -> None:
    for action in (["deposit"], {"x": 1}):
        env = sign_request(key(1), remote.market_id, action, {"amount": 5}, nonce=7)  # type: ignore[arg-type]
        with pytest.raises(FormatError) as f:
            remote.execute(env)
        assert f.value.reason == "UNKNOWN_ACTION"
    for query in (
        "/v1/events?after=99999999999999999999",
        "/v1/events?after=9223372036854775808",
        "/v1/events?after=100&wait=nan",
        "/v1/orders/o1/explain?intervals=%C2%B2",
    ):
        r = remote._http.get(query)
        assert r.status_code == 400 and r.json()["error"]["reason"] == "BAD_PARAMS", query


def test_a_batched_submit_needs_its_bundle_too(remote: RemoteMarket, tmp_path: Path) -> None:
    c, oid = _matched(remote)
    bundle = make_bundle(tmp_path / "b", JOB.job_id, c["worker"].account)
    submit = c["worker"].request("submit", order_id=oid, **bundle_commitment(bundle))
    (out,) = remote.execute_batch([submit])
    assert out["error"]["reason"] == "BUNDLE_UNKNOWN"
    other = c["consumer"].request("submit", order_id=oid, **bundle_commitment(bundle))
    with pytest.raises(MarketRefused) as e:  # not the order's worker: the action's own code
        remote.execute(other)
    assert e.value.reason == "NOT_OWNER"


def test_uploads_carry_every_bundle_file_and_refuse_partial_ones(
    remote: RemoteMarket, tmp_path: Path
) -> None:
    """A rounded bundle's logs and a data-parallel bundle's rank files were left out of the
    archive: the server's copy of an honest rounded bundle verified BLOB_MISSING."""
    import shutil

    from dk.market.transfer import pack_bundle, unpack_bundle

    vectors = Path(__file__).resolve().parents[3] / "vectors"
    for src in (vectors / "rounding" / "bundle" / "honest", vectors / "dp" / "honest"):
        if not src.is_dir():
            continue
        out = unpack_bundle(pack_bundle(src), tmp_path / src.parent.name)
        want = sorted(p.relative_to(src).as_posix() for p in src.rglob("*") if p.is_file())
        got = sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file())
        assert got == want, set(want) - set(got)
    honest = vectors / "rounding" / "bundle" / "honest"
    assert remote.upload_bundle(honest) == remote.upload_bundle(honest)  # held: a no-op
    partial = tmp_path / "partial"
    shutil.copytree(vectors / "rounding" / "bundle" / "honest", partial)
    next((partial / "logs").glob("*.dkrl")).unlink()
    with pytest.raises(FormatError) as f:
        remote.upload_bundle(partial)
    assert f.value.reason == "BUNDLE_INCOMPLETE"
