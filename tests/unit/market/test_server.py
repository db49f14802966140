"""``dk market serve`` over real HTTP on 127.0.0.1 (uvicorn in a thread or a subprocess)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")
pytest.importorskip("httpx")

from market_support import (
    T0,
    Clock,
    FakeBls,
    FakeJob,
    fake_replay,
    fake_verify,
    key,
    make_bundle,
    market_config,
    running,
)

from dk.errors import FormatError
from dk.market import Client, Market, MarketConfig, bundle_commitment
from dk.market.attest import attestation_message
from dk.market.client import RemoteMarket
from dk.market.errors import MarketRefused
from dk.market.server import OPENAPI, MarketService, RateLimit
from dk.market.transfer import pack_bundle, unpack_bundle

JOB = FakeJob(bytes(range(32)))


def make_service(tmp_path: Path, clock: Clock, **kw: object) -> MarketService:
    db = tmp_path / "market.db"
    Market.create(db, config=market_config(), salt=b"server-test", clock=clock).close()
    return MarketService(
        db,
        state_dir=tmp_path / "state",
        clock=clock,
        verify=fake_verify,
        replay=fake_replay,
        bls=FakeBls(),
        job_loader=lambda job_id: JOB,
        **kw,
    )


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def remote(tmp_path: Path, clock: Clock) -> Iterator[RemoteMarket]:
    with running(make_service(tmp_path, clock)) as url, RemoteMarket(url) as rm:
        yield rm


VALIDATORS = ("v1", "v2", "v3")
SK = {n: 1000 + i for i, n in enumerate(VALIDATORS)}


def clients(market_id: bytes) -> dict[str, Client]:
    names = ["consumer", "worker", *VALIDATORS, "challenger"]
    return {n: Client(key(i + 1), market_id) for i, n in enumerate(names)}


def run_to_matched(rm: RemoteMarket, c: dict[str, Client]) -> str:
    """Fund every client, stake the validators, and match one order with the worker's bid."""
    bls = FakeBls()
    for name in c:
        rm.execute(c[name].request("deposit", amount=1000))
    for n in VALIDATORS:  # staked validators, registered before the match draws them
        rm.execute(
            c[n].request(
                "register_validator",
                bls_pk=bls.sk_to_pk(SK[n]).hex(),
                pop=bls.pop_prove(SK[n]).hex(),
                stake=100,
            )
        )
    oid = rm.execute(
        c["consumer"].request(
            "order", job_id=JOB.job_id.hex(), max_price=100, min_stake=50, deadline=T0 + 1000
        )
    )["order_id"]
    rm.execute(c["worker"].request("bid", price=80, capacity=1, stake=60))
    rm.execute(c["consumer"].request("match", order_id=oid))
    return str(oid)


def run_to_verified(
    rm: RemoteMarket, c: dict[str, Client], tmp: Path, *, forged: bool, bad: list[int] | None = None
) -> str:
    oid = run_to_matched(rm, c)
    bls = FakeBls()
    bundle = make_bundle(
        tmp / f"b-{oid}", JOB.job_id, c["worker"].account, forged=forged, bad_intervals=bad
    )
    uploaded = rm.upload_bundle(bundle)
    assert uploaded == bundle_commitment(bundle)
    rm.execute(c["worker"].request("submit", order_id=oid, **bundle_commitment(bundle)))
    from dk.market.beacon import share_message

    order = rm.show(oid)  # read over HTTP: the commitment and the drawn set, in order
    commitment = order["commitment"]
    msg = share_message(
        rm.market_id,
        oid,
        bytes.fromhex(commitment["transcript_root"]),
        bytes.fromhex(commitment["manifest_digest"]),
    )
    by_account = {c[n].account: n for n in VALIDATORS}
    for account in order["validators"]:  # each drawn validator fixes its share of the beacon
        n = by_account[account]
        rm.execute(c[n].request("beacon_share", order_id=oid, signature=bls.sign(SK[n], msg).hex()))
    return oid


def test_honest_flow_over_http(remote: RemoteMarket, tmp_path: Path, clock: Clock) -> None:
    c = clients(remote.market_id)
    oid = run_to_verified(remote, c, tmp_path, forged=False)
    out = remote.verify_result(oid)
    assert out["ok"] is True
    bls = FakeBls()
    msg = attestation_message(remote.market_id, oid, bytes.fromhex(out["report_digest"]))
    for n in ("v1", "v2"):
        remote.execute(
            c[n].request(
                "attest",
                order_id=oid,
                report_digest=out["report_digest"],
                signature=bls.sign(SK[n], msg).hex(),
            )
        )
    remote.accept(oid)
    with pytest.raises(MarketRefused) as e:  # the window is open on the server's clock
        remote.settle(oid)
    assert e.value.reason == "NOT_SETTLEABLE"
    clock.t += 1000
    assert remote.settle(oid)["outcome"] == "released"
    assert remote.balance(c["worker"].account) == 1000 + 80
    assert remote.info()["now"] == T0 + 1000  # the server's clock, never a client's
    assert remote.audit()["ok"] is True


def test_whistles_and_the_treasury_over_http(
    remote: RemoteMarket, tmp_path: Path, clock: Clock
) -> None:
    """The attesters missed a bad challenged interval: a false whistle funds the treasury, a
    true one slashes them; explain and the treasury show it (SPEC V §13)."""
    c = clients(remote.market_id)
    oid = run_to_verified(remote, c, tmp_path, forged=False, bad=[2])
    out = remote.verify_result(oid)
    bls = FakeBls()
    msg = attestation_message(remote.market_id, oid, bytes.fromhex(out["report_digest"]))
    for n in ("v1", "v2"):
        remote.execute(
            c[n].request(
                "attest",
                order_id=oid,
                report_digest=out["report_digest"],
                signature=bls.sign(SK[n], msg).hex(),
            )
        )
    remote.accept(oid)
    false = remote.execute(c["consumer"].request("whistle", order_id=oid, interval=0, deposit=15))
    assert remote.resolve_whistle(false["whistle_id"])["forfeited"] == 15
    assert remote.treasury()["in"] == {"resolve_whistle": 15}
    true = remote.execute(c["challenger"].request("whistle", order_id=oid, interval=2, deposit=10))
    with pytest.raises(MarketRefused) as e:
        remote.settle(oid)
    assert e.value.reason == "NOT_SETTLEABLE"
    got = remote.resolve_whistle(true["whistle_id"])
    assert got["upheld"] and got["reward"] == 60 + 200  # worker's stake, two attesters' stakes
    assert remote.balance(c["challenger"].account) == 1000 + 260
    explained = remote.explain(oid, intervals=4)
    assert [w["state"] for w in explained["whistles"]] == ["failed", "upheld"]
    assert explained["treasury"] == 15 and remote.treasury()["conserved"]
    with pytest.raises(MarketRefused) as e:
        remote.resolve_whistle("w999")
    assert e.value.reason == "UNKNOWN_WHISTLE"
    assert remote.audit(check_bls=False)["ok"] is True


def test_forged_bundle_flow_over_http(remote: RemoteMarket, tmp_path: Path, clock: Clock) -> None:
    c = clients(remote.market_id)
    oid = run_to_verified(remote, c, tmp_path, forged=True)
    out = remote.verify_result(oid)
    assert out["ok"] is False
    assert remote.show(oid)["state"] == "rejected"
    assert remote.balance(c["consumer"].account) == 1000 + 60  # refund plus the slashed stake
    # nothing moved for the validators: their stakes stay locked, their balances untouched
    assert remote.balance(c["v1"].account) == 1000 - 100
    assert remote.audit()["ok"] is True


def test_errors_carry_the_library_reason_codes(remote: RemoteMarket) -> None:
    c = clients(remote.market_id)
    req = c["consumer"].request("deposit", amount=5)
    remote.execute(req)
    with pytest.raises(MarketRefused) as e:
        remote.execute(req)  # the same signed request again
    assert e.value.reason == "REPLAY"
    other = Client(key(9), bytes(32)).request("deposit", amount=5)
    with pytest.raises(FormatError) as f:
        remote.execute(other)
    assert f.value.reason == "WRONG_MARKET"
    with pytest.raises(FormatError) as f:
        remote.execute(b"{not json")
    assert f.value.reason == "MALFORMED_REQUEST"
    with pytest.raises(FormatError) as f:
        remote.execute(b"x" * (600 * 1024))
    assert f.value.reason == "TOO_LARGE"
    with pytest.raises(MarketRefused) as e:
        remote.show("o999")
    assert e.value.reason == "UNKNOWN_ORDER"
    r = remote._http.get("/v1/nowhere")
    assert r.status_code == 404 and r.json()["error"]["reason"] == "NOT_FOUND"


def test_client_refuses_another_market(remote: RemoteMarket) -> None:
    with pytest.raises(MarketRefused) as e:
        RemoteMarket(remote.url, market_id=bytes(32))
    assert e.value.reason == "WRONG_MARKET"


def test_rate_limit_per_account(tmp_path: Path, clock: Clock) -> None:
    service = make_service(tmp_path, clock, rate=RateLimit(rate=0.001, burst=3))
    with running(service) as url, RemoteMarket(url) as rm:
        c = clients(rm.market_id)
        for _ in range(3):
            rm.execute(c["consumer"].request("deposit", amount=1))
        with pytest.raises(MarketRefused) as e:
            rm.execute(c["consumer"].request("deposit", amount=1))
        assert e.value.reason == "RATE_LIMITED"
        rm.execute(c["worker"].request("deposit", amount=1))  # another account is not limited
        assert rm.balance(c["consumer"].account) == 3


def test_events_long_poll_sees_a_new_event(remote: RemoteMarket) -> None:
    c = clients(remote.market_id)
    head = remote.events()["seq"]
    got: dict[str, object] = {}

    def follow() -> None:
        got["out"] = remote.events(after=head, wait=10)

    t = threading.Thread(target=follow)
    t0 = time.monotonic()
    t.start()
    time.sleep(0.3)
    remote.execute(c["worker"].request("deposit", amount=7))
    t.join(15)
    events = got["out"]["events"]  # type: ignore[index]
    assert [e["body"]["kind"] for e in events] == ["deposit"]
    assert time.monotonic() - t0 < 10  # woke on the event, not the timeout
    assert remote.events(after=head + 1, wait=0.2)["events"] == []


def test_load_four_clients_no_lost_or_duplicated_effects(
    remote: RemoteMarket, tmp_path: Path
) -> None:
    n_clients, per_client = 4, 500
    signers = [Client(key(40 + i), remote.market_id) for i in range(n_clients)]
    reqs = [[s.request("deposit", amount=1 + j % 3) for j in range(per_client)] for s in signers]
    errors: list[BaseException] = []

    def send(batch: list[dict]) -> None:
        try:
            with RemoteMarket(remote.url) as rm:
                for r in batch:
                    rm.execute(r)
                    if len(batch) and r is batch[0]:
                        with pytest.raises(MarketRefused):
                            rm.execute(r)  # a retried request is refused, not applied twice
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=send, args=(b,)) for b in reqs]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert not errors, errors
    expected = sum(1 + j % 3 for j in range(per_client))
    for s in signers:
        assert remote.balance(s.account) == expected
    kinds = [e["body"]["kind"] for e in remote.events(after=0, limit=1000)["events"]] + [
        e["body"]["kind"] for e in remote.events(after=1000, limit=1000)["events"]
    ]
    assert kinds.count("deposit") == n_clients * per_client
    assert remote.audit(check_bls=False)["ok"] is True


def test_openapi_is_served_and_checked_in(remote: RemoteMarket) -> None:
    served = remote._get("/openapi.json")
    assert served == OPENAPI
    checked_in = Path(__file__).resolve().parents[3] / "docs" / "openapi.json"
    assert json.loads(checked_in.read_text()) == OPENAPI, (
        "run: python -m dk.market.server --openapi"
    )


def test_bundle_archive_is_read_strictly(tmp_path: Path) -> None:
    import io
    import tarfile

    bundle = make_bundle(tmp_path / "b", JOB.job_id, "00" * 32)
    (bundle / "blobs").mkdir()
    (bundle / "blobs" / ("ab" * 32 + ".safetensors")).write_bytes(b"x" * 10)
    (bundle / "stray.py").write_text("import os")
    data = pack_bundle(bundle)
    out = unpack_bundle(data, tmp_path / "copy")
    assert sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file()) == [
        "blobs/" + "ab" * 32 + ".safetensors",
        "manifest.json",
    ]

    def tar_with(info: tarfile.TarInfo, payload: bytes = b"") -> bytes:
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tar:
            m = tarfile.TarInfo("manifest.json")
            m.size = 2
            tar.addfile(m, io.BytesIO(b"{}"))
            info.size = len(payload)
            tar.addfile(info, io.BytesIO(payload))
        return buf.getvalue()

    link = tarfile.TarInfo("signature.hex")
    link.type, link.linkname = tarfile.SYMTYPE, "/etc/passwd"
    for bad in (
        tar_with(link),
        tar_with(tarfile.TarInfo("../evil.json"), b"x"),
        tar_with(tarfile.TarInfo("blobs/../../x.safetensors"), b"x"),
        tar_with(tarfile.TarInfo("manifest.json"), b"{}"),  # twice
        b"not a tar at all" * 100,
    ):
        with pytest.raises(FormatError):
            unpack_bundle(bad, tmp_path / f"x{len(bad)}-{hash(bad) & 0xFFFF}")
    with pytest.raises(FormatError):
        unpack_bundle(data, tmp_path / "small", limit=5)


SERVER_PROC = """
import sys
from dk.market.server import serve
serve(sys.argv[1], port=0, ready=lambda p: print(p, flush=True))
"""


@pytest.mark.slow
def test_kill_9_mid_settlement_then_restart_audits_clean(tmp_path: Path) -> None:
    db = tmp_path / "market.db"
    Market.create(db, config=MarketConfig(k=1, n=1, window=1)).close()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}

    def start() -> tuple[subprocess.Popen[str], str]:
        proc = subprocess.Popen(
            [sys.executable, "-c", SERVER_PROC, str(db)],
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        assert proc.stdout is not None
        port = int(proc.stdout.readline())
        return proc, f"http://127.0.0.1:{port}"

    proc, url = start()
    try:
        rm = RemoteMarket(url)
        consumer = Client(key(1), rm.market_id)
        rm.execute(consumer.request("deposit", amount=10_000))
        deadline = int(rm.info()["now"]) + 2
        orders = [
            rm.execute(
                consumer.request(
                    "order", job_id="ab" * 32, max_price=10, min_stake=1, deadline=deadline
                )
            )["order_id"]
            for _ in range(40)
        ]
        while int(rm.info()["now"]) < deadline:
            time.sleep(0.1)
        settled: list[str] = []

        def settle_all() -> None:
            for oid in orders:
                try:
                    rm.settle(oid)
                    settled.append(oid)
                except Exception:
                    return

        t = threading.Thread(target=settle_all)
        t.start()
        while len(settled) < 5 and t.is_alive():
            time.sleep(0.005)
        os.kill(proc.pid, signal.SIGKILL)
        t.join(30)
        rm.close()
    finally:
        proc.kill()
        proc.wait(10)
    assert 5 <= len(settled) < len(orders), "the kill did not land mid-settlement"
    proc, url = start()
    try:
        with RemoteMarket(url) as rm:
            report = rm.audit(check_bls=False)
            assert report["ok"] is True, report
            for oid in orders:  # every settle that was answered is durable; others can finish
                outcome = rm.show(oid)["outcome"]
                assert outcome == "expired" or oid not in settled
                if outcome is None:
                    rm.settle(oid)
                    assert rm.show(oid)["outcome"] == "expired"
            assert rm.balance(consumer.account) == 10_000
            assert rm.audit(check_bls=False)["ok"] is True
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(20)


def test_batch_applies_each_envelope_on_its_own(remote: RemoteMarket) -> None:
    c = clients(remote.market_id)
    good = c["consumer"].request("deposit", amount=5)
    forged = c["worker"].request("deposit", amount=7)
    forged = {**forged, "signature": "00" * 64}
    other = Client(key(9), bytes(32)).request("deposit", amount=3)
    after = c["worker"].request("deposit", amount=11)
    results = remote.execute_batch([good, forged, good, other, after])
    assert "ok" in results[0] and results[0]["ok"]["amount"] == 5
    assert results[1]["error"]["reason"] == "BAD_SIGNATURE"
    assert results[2]["error"]["reason"] == "REPLAY"  # the same envelope again: once only
    assert results[3]["error"]["reason"] == "WRONG_MARKET"
    assert results[4]["ok"]["amount"] == 11  # a refusal before it refuses nothing else
    assert remote.balance(c["consumer"].account) == 5
    assert remote.balance(c["worker"].account) == 11
    kinds = [e["body"]["kind"] for e in remote.events(after=0)["events"]]
    assert kinds.count("deposit") == 2  # one event (one transaction) per applied envelope
    assert remote.audit(check_bls=False)["ok"] is True
    for bad in (b"{}", b"[]", b"[" + b",".join([b"{}"] * 65) + b"]", b"[1,"):
        r = remote._http.post("/v1/requests/batch", content=bad)
        assert r.status_code == 400 and r.json()["error"]["reason"] == "MALFORMED_REQUEST"
    r = remote._http.post("/v1/requests/batch", content=b"[" + b" " * (5 << 20) + b"]")
    assert r.status_code == 413 and r.json()["error"]["reason"] == "TOO_LARGE"


def test_single_requests_skip_the_router_but_not_its_rules(remote: RemoteMarket) -> None:
    # POST /v1/requests is answered before the router: same codes, bodies and limits
    r = remote._http.get("/v1/requests")
    assert r.status_code == 405 and r.json()["error"]["reason"] == "METHOD_NOT_ALLOWED"
    r = remote._http.post("/v1/requests", content=b"[]")
    assert r.status_code == 400 and r.json()["error"]["reason"] == "MALFORMED_REQUEST"
    c = clients(remote.market_id)
    r = remote._http.post(
        "/v1/requests", content=json.dumps(c["worker"].request("deposit", amount=2))
    )
    assert r.status_code == 200 and r.headers["content-type"] == "application/json"
    assert r.json()["amount"] == 2
