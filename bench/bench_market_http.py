"""`make bench` (market server): signed order/bid/match per second over HTTP vs in-process.

The same pre-signed requests (a consumer's orders, workers' bids, the consumer's matches) go
once straight into :meth:`Market.execute` and once over HTTP to ``dk market serve``'s app on
127.0.0.1 (uvicorn in a thread, 4 client threads, keep-alive connections). Target: >= 1,000
signed operations per second over HTTP on this machine.
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


def _requests(market_id: bytes, deadline: int) -> list[list[dict[str, Any]]]:
    """Per client thread: a consumer's order, a worker's bid and the match, in order."""
    batches: list[list[dict[str, Any]]] = []
    for t in range(CLIENTS):
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
    import uvicorn

    from dk.market.client import RemoteMarket
    from dk.market.server import MarketService, RateLimit, create_app

    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        now = int(time.time())
        m = Market.create(tmp / "inproc.db", config=MarketConfig())
        _validators(m.execute, m.market_id)
        n, s = _run(m.execute, _requests(m.market_id, now + 3600), False)
        m.close()
        inproc = n / s

        Market.create(tmp / "http.db", config=MarketConfig()).close()
        service = MarketService(
            tmp / "http.db", state_dir=tmp / "state", rate=RateLimit(rate=1e9, burst=1e9)
        )
        server = uvicorn.Server(
            uvicorn.Config(
                create_app(service), host="127.0.0.1", port=0, log_level="warning", ws="none"
            )
        )
        thread = threading.Thread(target=server.run, daemon=True)
        thread.start()
        while not server.started:
            time.sleep(0.01)
        url = f"http://127.0.0.1:{server.servers[0].sockets[0].getsockname()[1]}"
        remotes = [RemoteMarket(url) for _ in range(CLIENTS)]
        _validators(remotes[0].execute, service.market_id)
        batches = _requests(service.market_id, now + 3600)
        local = threading.local()
        pool = iter(remotes)
        pool_lock = threading.Lock()

        def execute(req: dict[str, Any]) -> dict[str, Any]:
            if not hasattr(local, "rm"):
                with pool_lock:
                    local.rm = next(pool)
            return local.rm.execute(req)

        n, s = _run(execute, batches, True)
        http = n / s
        for rm in remotes:
            rm.close()
        server.should_exit = True
        thread.join(20)
        service.close()

    print(f"{'path':<34}{'signed ops/s':>14}")
    print(f"{'in-process Market.execute':<34}{inproc:>14.0f}")
    print(f"{'HTTP, ' + str(CLIENTS) + ' client threads':<34}{http:>14.0f}")
    print(
        f"HTTP / in-process = {http / inproc:.2f}; target >= {TARGET:.0f}/s over HTTP: "
        f"{'MET' if http >= TARGET else 'NOT MET'}"
    )


if __name__ == "__main__":
    main()
