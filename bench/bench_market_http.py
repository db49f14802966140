"""`make bench` (market server): signed order/bid/match per second over HTTP vs in-process.

The same pre-signed requests (a consumer's orders, workers' bids, the consumer's matches) go
once straight into :meth:`Market.execute` and once over HTTP to ``dk market serve``'s app on
127.0.0.1 (the server in its own process, 4 client processes with keep-alive connections).
Target: >= 1,000 signed operations per second over HTTP on this machine. The server applies
requests on one writer thread, so the in-process rate is its ceiling.
"""

from __future__ import annotations

import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from dk.crypto.keys import SigningKey
from dk.market import Client, Market, MarketConfig

N_ORDERS = 250  # each is order + bid + match: 750 signed state changes per run
CLIENTS = 4
TARGET = 1000.0


def _requests(
    market_id: bytes, deadline: int, lanes: range | list[int] = range(CLIENTS)
) -> list[list[dict[str, Any]]]:
    """Per client: a consumer's order, a worker's bid and the match, in order."""
    batches: list[list[dict[str, Any]]] = []
    for t in lanes:
        consumer = Client(SigningKey(bytes([10 + t]) * 32), market_id)
        worker = Client(SigningKey(bytes([50 + t]) * 32), market_id)
        batch = [
            consumer.request("deposit", amount=10**9),
            worker.request("deposit", amount=10**9),
        ]
        for i in range(N_ORDERS // CLIENTS):
            oid = None  # order ids are assigned by the market: match is signed after the order
            batch.append(
                consumer.request(
                    "order",
                    job_id=f"{t:02x}{i:062x}",
                    max_price=100,
                    min_stake=1,
                    deadline=deadline,
                    tags={"lane": f"t{t}"},
                )
            )
            batch.append(
                worker.request("bid", price=50, capacity=1, stake=1, tags={"lane": f"t{t}"})
            )
            batch.append({"match_of": oid, "consumer": consumer})
        batches.append(batch)
    return batches


def _lane(url: str, t: int, deadline: int, go: Any, out: Any) -> None:
    """One client process: its own connection, its own consumer and worker, lane ``t``."""
    from dk.market.client import RemoteMarket

    with RemoteMarket(url) as rm:
        batch = _requests(rm.market_id, deadline, [t])
        out.put("ready")
        go.wait()
        n, _ = _run(rm.execute, batch, False)
    out.put(n)


def _validators(execute: Any, market_id: bytes) -> None:
    """Three staked validators (every match draws n = 3 of them); not timed."""
    from dk.market.attest import BlsKey
    from dk.market.validator import registration_request

    for j in range(3):
        c = Client(SigningKey(bytes([200 + j]) * 32), market_id)
        execute(c.request("deposit", amount=10**6))
        execute(registration_request(c, BlsKey.from_seed(bytes([j + 1]) * 32), 100))


def _run(execute: Any, batches: list[list[dict[str, Any]]], threads: bool) -> tuple[int, float]:
    count = [0]
    lock = threading.Lock()

    def one(batch: list[dict[str, Any]]) -> None:
        last_order = None
        n = 0
        for req in batch:
            if "match_of" in req:
                req = req["consumer"].request("match", order_id=last_order)
            out = execute(req)
            last_order = out.get("order_id", last_order)
            n += 1
        with lock:
            count[0] += n

    t0 = time.perf_counter()
    if threads:
        ts = [threading.Thread(target=one, args=(b,)) for b in batches]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
    else:
        for b in batches:
            one(b)
    return count[0], time.perf_counter() - t0


def main() -> None:
    from dk.market.client import RemoteMarket

    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        now = int(time.time())
        m = Market.create(tmp / "inproc.db", config=MarketConfig())
        _validators(m.execute, m.market_id)
        n, s = _run(m.execute, _requests(m.market_id, now + 3600), False)
        m.close()
        inproc = n / s

        Market.create(tmp / "http.db", config=MarketConfig()).close()
        # the server in its own process (as deployed): clients here do not share its GIL
        import subprocess
        import sys

        code = (
            "import sys\n"
            "from dk.market.server import serve\n"
            "serve(sys.argv[1], port=0, ready=lambda p: print(p, flush=True))\n"
        )
        proc = subprocess.Popen(
            [sys.executable, "-c", code, str(tmp / "http.db")], stdout=subprocess.PIPE, text=True
        )
        assert proc.stdout is not None
        url = f"http://127.0.0.1:{int(proc.stdout.readline())}"
        try:
            import multiprocessing as mp

            with RemoteMarket(url) as rm:
                _validators(rm.execute, rm.market_id)
            ctx = mp.get_context("spawn")
            go, out = ctx.Event(), ctx.Queue()
            lanes = [
                ctx.Process(target=_lane, args=(url, t, now + 3600, go, out))
                for t in range(CLIENTS)
            ]
            for p in lanes:
                p.start()
            for _ in lanes:
                assert out.get(timeout=120) == "ready"
            t0 = time.perf_counter()
            go.set()
            n = sum(int(out.get(timeout=600)) for _ in lanes)
            http = n / (time.perf_counter() - t0)
            for p in lanes:
                p.join(30)
        finally:
            proc.terminate()
            proc.wait(30)

    print(f"{'path':<34}{'signed ops/s':>14}")
    print(f"{'in-process Market.execute':<34}{inproc:>14.0f}")
    print(f"{'HTTP, ' + str(CLIENTS) + ' client processes':<34}{http:>14.0f}")
    print(
        f"HTTP / in-process = {http / inproc:.2f}; target >= {TARGET:.0f}/s over HTTP: "
        f"{'MET' if http >= TARGET else 'NOT MET'}"
    )


if __name__ == "__main__":
    main()
