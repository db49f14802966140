"""``dk market serve``: the market ledger behind an HTTP/JSON API (Starlette on uvicorn).

The server is a thin shell over :class:`dk.market.Market`; every rule stays in the library.
What the server adds (SPEC V §9):

* **It owns the clock.** Every state change is stamped with the server's own time; no
  request can carry one.
* **One writer.** All ledger calls run on one dedicated thread, in arrival order, so a
  state change is one SQLite transaction exactly as in the embedded market.
* **Limits.** A request body is read up to a fixed size (a signed request 512 KiB, a job
  64 KiB, a bundle archive 1 GiB), and each authenticated account has a token bucket.
* **Clear errors.** Every refusal is ``{"error": {"reason": CODE, "message": TEXT}}`` with the
  library's own reason code: 400 malformed (FormatError), 409 refused by the market
  (MarketRefused), 404 unknown, 413 too large, 429 rate limited.

Bundles and jobs reach the server as uploads (``POST /v1/bundles`` a tar read by
:func:`dk.market.transfer.unpack_bundle`; ``POST /v1/jobs`` the job's TOML), stored under the
server's state directory by manifest digest and job id. Custom model files are not uploaded:
a server verifies only jobs it can load itself.
"""

from __future__ import annotations

import asyncio
import errno
import json
import os
import queue
import shutil
import socket
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dk.crypto.hashing import parse_hex_digest
from dk.errors import BackendUnavailable, DkError, FormatError, UsageError
from dk.market.errors import MarketRefused
from dk.market.market import Market
from dk.market.requests import MAX_REQUEST, parse_request
from dk.market.results import read_manifest
from dk.market.transfer import MAX_BUNDLE_BYTES, unpack_bundle

MAX_JOB = 64 * 1024
MAX_BATCH = 64  # signed requests in one POST /v1/requests/batch
MAX_BATCH_BYTES = 4 * 1024 * 1024
CHECKPOINT_EVERY_S = 1.0  # SQLite: the WAL reaches the disk (fsync) at least this often
MAX_WAIT_S = 30.0
MAX_EVENTS = 1000
API_VERSION = "v1"


@dataclass
class RateLimit:
    """A token bucket per account: ``rate`` requests per second, bursts up to ``burst``."""

    rate: float = 2000.0
    burst: float = 4000.0


class _Buckets:
    def __init__(self, limit: RateLimit, clock: Callable[[], float]) -> None:
        self.limit, self.clock = limit, clock
        self._state: dict[str, tuple[float, float]] = {}
        self._lock = threading.Lock()

    def take(self, account: str) -> bool:
        now = self.clock()
        with self._lock:
            tokens, last = self._state.get(account, (self.limit.burst, now))
            tokens = min(self.limit.burst, tokens + (now - last) * self.limit.rate)
            if tokens < 1.0:
                self._state[account] = (tokens, now)
                return False
            self._state[account] = (tokens - 1.0, now)
            return True


class _Writer:
    """The one thread that touches the ledger: jobs run in arrival order, one at a time.

    Leaner than a one-thread executor plus ``asyncio.wrap_future``: the job's result goes
    straight to the waiting coroutine's future with one ``call_soon_threadsafe``.
    """

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._loop, name="dk-market-writer", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            fn, args, kwargs, done = job
            try:
                result, error = fn(*args, **kwargs), None
            except BaseException as e:  # handed to the caller
                result, error = None, e
            done(result, error)

    def call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Run ``fn`` on the writer thread and wait for it (from any other thread)."""
        fut: Future[Any] = Future()

        def done(result: Any, error: BaseException | None) -> None:
            if error is None:
                fut.set_result(result)
            else:
                fut.set_exception(error)

        self._jobs.put((fn, args, kwargs, done))
        return fut.result()

    async def run(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Run ``fn`` on the writer thread; the calling coroutine waits without blocking."""
        loop = asyncio.get_running_loop()
        fut = loop.create_future()

        def settle(result: Any, error: BaseException | None) -> None:
            if fut.cancelled():
                return
            if error is None:
                fut.set_result(result)
            else:
                fut.set_exception(error)

        def done(result: Any, error: BaseException | None) -> None:
            loop.call_soon_threadsafe(settle, result, error)

        self._jobs.put((fn, args, kwargs, done))
        return await fut

    def stop(self) -> None:
        """Finish the queued jobs and end the thread."""
        self._jobs.put(None)
        self._thread.join()


class HttpError(Exception):
    """A refusal the server answers with ``status`` and the body ``{"error": {...}}``."""

    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(message)
        self.status, self.reason, self.message = status, reason, message


class MarketService:
    """The server's state: one market opened on one writer thread, and its upload store.

    Args:
        db: the ledger file (created beforehand with ``dk market init``).
        state_dir: where uploaded jobs and bundles are kept (``jobs/``, ``bundles/``).
        clock: injected time, accepted only by a ledger created with ``clock = "test"``;
            otherwise the market keeps its own (the server's) clock. Never a client's.
        rate: per-account token bucket.
        job_loader: how a job id becomes a job (default: the uploaded ``job.toml``).
        market_kwargs: passed to :class:`Market` (test doubles for verify/replay/BLS).
    """

    def __init__(
        self,
        db: str | Path,
        *,
        state_dir: str | Path,
        clock: Callable[[], int] | None = None,
        rate: RateLimit | None = None,
        job_loader: Callable[[str], Any] | None = None,
        **market_kwargs: Any,
    ) -> None:
        self._job_loader = job_loader
        self.state_dir = Path(state_dir)
        (self.state_dir / "jobs").mkdir(parents=True, exist_ok=True)
        (self.state_dir / "bundles").mkdir(parents=True, exist_ok=True)
        self._writer = _Writer()
        self.market: Market = self._writer.call(Market, db, clock=clock, **market_kwargs)
        self.market_id = self.market.market_id
        # SQLite: the write-ahead log is checkpointed beside the writer, not inside its
        # commits (SPEC V Notes: durability)
        self._writer.call(self.market.ledger.start_checkpoints, CHECKPOINT_EVERY_S)
        self._buckets = _Buckets(rate or RateLimit(), time.monotonic)
        self._changed = asyncio.Event()

    def now(self) -> int:
        """The server's (the market's own) time in integer seconds."""
        return self.market.now()

    async def run(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Run ``fn`` on the writer thread (the only thread that touches the ledger)."""
        return await self._writer.run(fn, *args, **kwargs)

    def close(self) -> None:
        """Close the ledger and stop the writer thread."""
        self._writer.call(self.market.close)
        self._writer.stop()

    # -- state changes ------------------------------------------------------------------

    def execute(self, raw: bytes) -> dict[str, Any]:
        """Authenticate, rate-limit and apply one signed request (writer thread)."""
        req = parse_request(raw, market_id=self.market_id)
        if not self._buckets.take(req.account):
            raise HttpError(429, "RATE_LIMITED", f"account {req.account[:16]}… is over its rate")
        self._delivered(req)
        return self.market.apply(req)  # authenticated once, above

    def _delivered(self, req: Any) -> None:
        """SPEC V §5.1, §9: a worker commits to a bundle the service already holds, so it
        cannot withhold it once the beacon shows it would be caught (the timed-out order's
        stake goes back to the worker only because the market had the bundle). The held
        bundle must be the order's (job, worker, commitment; a cluster's ranks, §14.4)."""
        if req.action != "submit":
            return
        p = req.params
        digest, root, oid = p.get("manifest_digest"), p.get("transcript_root"), p.get("order_id")
        if not (isinstance(oid, str) and _is_hex64(digest) and _is_hex64(root)):
            return  # the action's own parameter check refuses it (BAD_PARAMS)
        # 409 BUNDLE_UNKNOWN when the server holds no such bundle: upload it first
        self.market.check_delivery(oid, req.account, digest, root, lambda: self.bundle_dir(digest))

    def execute_batch(self, raw: bytes) -> dict[str, Any]:
        """Apply a JSON array of signed requests, each on its own (writer thread).

        Every envelope is authenticated, rate-limited and applied exactly as if it had been
        posted alone, in its own ledger transaction and in array order; one refused envelope
        refuses nothing else. Returns ``{"results": [{"ok": DATA} | {"error": {...}}, ...]}``.
        """
        from dk.crypto.canonical_json import parse_json

        try:
            envelopes = parse_json(raw, limit=MAX_BATCH_BYTES, what="request batch")
        except FormatError as e:
            raise FormatError(str(e), reason="MALFORMED_REQUEST") from None
        if not isinstance(envelopes, list) or not 1 <= len(envelopes) <= MAX_BATCH:
            raise FormatError(
                f"a batch is a JSON array of 1 to {MAX_BATCH} signed requests",
                reason="MALFORMED_REQUEST",
            )
        results: list[dict[str, Any]] = []
        for env in envelopes:
            try:
                req = parse_request(env, market_id=self.market_id)
                if not self._buckets.take(req.account):
                    raise HttpError(
                        429, "RATE_LIMITED", f"account {req.account[:16]}… is over its rate"
                    )
                self._delivered(req)
                results.append({"ok": self.market.apply(req)})
            except HttpError as e:
                results.append({"error": {"reason": e.reason, "message": e.message}})
            except MarketRefused as e:
                results.append({"error": {"reason": e.reason, "message": str(e)}})
            except DkError as e:
                reason = (e.reason if isinstance(e, FormatError) else None) or "MALFORMED"
                results.append({"error": {"reason": reason, "message": str(e)}})
        return {"results": results}

    def store_job(self, text: bytes) -> dict[str, Any]:
        """Keep an uploaded job (its TOML) under its job id."""
        from dk.pol.job import parse_job

        try:
            decoded = text.decode("utf-8")
        except UnicodeDecodeError:
            raise FormatError("job is not UTF-8", reason="JOB_MALFORMED") from None
        job = parse_job(decoded, base_dir=self.state_dir / "jobs")
        job_id = bytes(job.job_id).hex()
        target = self.state_dir / "jobs" / f"{job_id}.toml"
        _atomic_write(target, text)
        return {"job_id": job_id}

    def job(self, job_id: str) -> Any:
        """The stored job ``job_id``."""
        from dk.pol.job import load_job

        if self._job_loader is not None:
            return self._job_loader(job_id)
        path = self.state_dir / "jobs" / f"{job_id}.toml"
        if not _is_hex64(job_id) or not path.is_file():
            raise HttpError(409, "JOB_UNKNOWN", f"the server holds no job {job_id[:16]}…")
        return load_job(path)

    def store_bundle(self, data: bytes) -> dict[str, Any]:
        """Unpack an uploaded bundle archive and keep it under its manifest digest."""
        tmp = Path(tempfile.mkdtemp(dir=self.state_dir / "bundles", prefix=".upload-"))
        try:
            unpack_bundle(data, tmp / "b")
            manifest, digest = read_manifest(tmp / "b")
            _check_complete(tmp / "b", manifest)  # a copy kept is a whole one
            target = self.state_dir / "bundles" / digest.hex()
            if not target.exists():
                try:
                    os.replace(tmp / "b", target)
                except OSError:  # the same bundle stored by a concurrent upload meanwhile
                    if not target.is_dir():
                        raise
            return {
                "manifest_digest": digest.hex(),
                "transcript_root": manifest["transcript_root"],
            }
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    def bundle_dir(self, manifest_digest: str) -> Path:
        """Where the uploaded bundle ``manifest_digest`` is kept."""
        path = self.state_dir / "bundles" / manifest_digest
        if not _is_hex64(manifest_digest) or not path.is_dir():
            raise HttpError(
                409, "BUNDLE_UNKNOWN", f"the server holds no bundle {manifest_digest[:16]}…"
            )
        return path

    def verify(self, order_id: str) -> dict[str, Any]:
        """The market's own verification of the bundle committed for ``order_id``."""
        order = self.market.order(order_id)
        if not order["commitment"]:
            raise MarketRefused("BAD_STATE", f"{order_id} has no committed result")
        digest = json.loads(order["commitment"])["manifest_digest"]
        return self.market.verify_result(
            order_id, self.bundle_dir(digest), self.job(order["job_id"])
        )

    def resolve(self, challenge_id: str) -> dict[str, Any]:
        """Decide a challenge by replaying the disputed interval of the committed bundle."""
        row = self.market.ledger.con.execute(
            "SELECT order_id FROM challenges WHERE challenge_id = ?", (challenge_id,)
        ).fetchone()
        if row is None:
            raise MarketRefused("UNKNOWN_CHALLENGE", f"no challenge {challenge_id}")
        order = self.market.order(row[0])
        digest = json.loads(order["commitment"])["manifest_digest"]
        return self.market.resolve_challenge(
            challenge_id, self.bundle_dir(digest), self.job(order["job_id"])
        )

    def resolve_whistle(self, whistle_id: str) -> dict[str, Any]:
        """Decide a whistle by replaying its interval of the committed bundle (SPEC V §13)."""
        row = self.market.ledger.con.execute(
            "SELECT order_id FROM whistles WHERE whistle_id = ?", (whistle_id,)
        ).fetchone()
        if row is None:
            raise MarketRefused("UNKNOWN_WHISTLE", f"no whistle {whistle_id}")
        order = self.market.order(row[0])
        digest = json.loads(order["commitment"])["manifest_digest"]
        return self.market.resolve_whistle(
            whistle_id, self.bundle_dir(digest), self.job(order["job_id"])
        )

    # -- reads --------------------------------------------------------------------------

    def info(self) -> dict[str, Any]:
        """The market's identity, configuration, head and the server's time."""
        seq, head = self.market.ledger.head()
        return {
            "api": API_VERSION,
            "market_id": self.market_id.hex(),
            "config": self.market.config.to_dict(),
            "seq": seq,
            "head": head.hex(),
            "now": self.now(),
        }

    def events(self, after: int, limit: int) -> dict[str, Any]:
        """Events with ``seq > after`` (at most ``limit``), each with its hashes and body."""
        rows = self.market.ledger.con.execute(
            "SELECT seq, prev_hash, hash, body FROM events WHERE seq > ? ORDER BY seq LIMIT ?",
            (after, limit),
        ).fetchall()
        seq, head = self.market.ledger.head()
        return {
            "events": [
                {
                    "seq": int(r[0]),
                    "prev_hash": bytes(r[1]).hex(),
                    "hash": bytes(r[2]).hex(),
                    "body": json.loads(bytes(r[3])),
                }
                for r in rows
            ],
            "seq": seq,
            "head": head.hex(),
        }


def _check_complete(bundle: Path, manifest: dict[str, Any]) -> None:
    """Every file the manifest names is in the upload, of its size (SPEC V §9): checkpoint
    blobs and a rounded run's logs (a data-parallel run's ``ranks/`` evidence is the worker's
    to give or not, SPEC §12.6). A partial upload is refused rather than kept, so the server's
    copy of a committed bundle is whole.

    Raises:
        FormatError: ``BUNDLE_INCOMPLETE``.
    """
    named: list[tuple[Any, Any]] = [
        (c.get("blob"), c.get("nbytes"))
        for c in manifest.get("checkpoints") or []
        if isinstance(c, dict)
    ]
    for iv in manifest.get("intervals") or []:
        log = ((iv.get("ext") or {}) if isinstance(iv, dict) else {}).get("rounding_log")
        if isinstance(log, dict):
            named.append((log.get("blob"), log.get("nbytes")))
    for rel, nbytes in named:
        if not isinstance(rel, str):
            continue  # the verifier judges a malformed manifest
        p = bundle / rel
        if not (p.is_file() and (not isinstance(nbytes, int) or p.stat().st_size == nbytes)):
            raise FormatError(
                f"the upload lacks {rel[:80]} (or holds it at another size): upload the whole "
                "bundle directory",
                reason="BUNDLE_INCOMPLETE",
            )


def _is_hex64(s: Any) -> bool:
    """32 bytes in lowercase hex (dk's one hex check, :func:`parse_hex_digest`)."""
    try:
        parse_hex_digest(s)
    except FormatError:
        return False
    return True


def _atomic_write(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


# -- the ASGI app ---------------------------------------------------------------------------


def create_app(service: MarketService) -> Any:
    """The Starlette application over ``service`` (routes listed in :data:`OPENAPI`)."""
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    def error(status: int, reason: str, message: str) -> JSONResponse:
        return JSONResponse({"error": {"reason": reason, "message": message}}, status)

    async def read_body(request: Request, limit: int) -> bytes:
        declared = request.headers.get("content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > limit):
            raise HttpError(413, "TOO_LARGE", f"request body is over {limit} bytes")
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise HttpError(413, "TOO_LARGE", f"request body is over {limit} bytes")
            chunks.append(chunk)
        return b"".join(chunks)

    def endpoint(fn: Callable[[Request], Any]) -> Callable[[Request], Any]:
        async def wrapped(request: Request) -> JSONResponse:
            try:
                return JSONResponse(await fn(request))
            except HttpError as e:
                return error(e.status, e.reason, e.message)
            except MarketRefused as e:
                return error(409, e.reason, str(e))
            except FormatError as e:
                return error(400, e.reason or "MALFORMED", str(e))
            except DkError as e:
                return error(400, "MALFORMED", str(e))

        return wrapped

    async def changed() -> None:
        service._changed.set()
        service._changed = asyncio.Event()

    @endpoint
    async def info(request: Request) -> Any:
        return await service.run(service.info)

    @endpoint
    async def post_request(request: Request) -> Any:
        raw = await read_body(request, MAX_REQUEST)
        out = await service.run(service.execute, raw)
        await changed()
        return out

    @endpoint
    async def post_batch(request: Request) -> Any:
        raw = await read_body(request, MAX_BATCH_BYTES)
        out = await service.run(service.execute_batch, raw)
        await changed()
        return out

    @endpoint
    async def post_job(request: Request) -> Any:
        return await service.run(service.store_job, await read_body(request, MAX_JOB))

    @endpoint
    async def post_bundle(request: Request) -> Any:
        data = await read_body(request, MAX_BUNDLE_BYTES)
        return await asyncio.to_thread(service.store_bundle, data)

    @endpoint
    async def orders(request: Request) -> Any:
        return await service.run(service.market.book)

    @endpoint
    async def order(request: Request) -> Any:
        return await service.run(service.market.show, request.path_params["order_id"])

    @endpoint
    async def order_row(request: Request) -> Any:
        row = await service.run(service.market.order, request.path_params["order_id"])
        return dict(row)

    @endpoint
    async def explain(request: Request) -> Any:
        raw = request.query_params.get("intervals")
        if raw is not None and not (raw.isascii() and raw.isdigit() and 0 < int(raw) <= 10**9):
            raise HttpError(400, "BAD_PARAMS", "intervals must be a positive integer")
        oid = request.path_params["order_id"]
        m = None if raw is None else int(raw)
        return await service.run(lambda: service.market.explain(oid, intervals=m))

    @endpoint
    async def redraw(request: Request) -> Any:
        out = await service.run(service.market.redraw, request.path_params["order_id"])
        await changed()
        return out

    @endpoint
    async def balance(request: Request) -> Any:
        account = request.path_params["account"]
        if not _is_hex64(account):
            raise HttpError(400, "BAD_PARAMS", "account must be 64 lowercase hex characters")
        return {"account": account, "balance": await service.run(service.market.balance, account)}

    def market_action(name: str) -> Callable[[Request], Any]:
        @endpoint
        async def act(request: Request) -> Any:
            oid = request.path_params["order_id"]
            if name == "verify":
                out = await service.run(service.verify, oid)
            elif name == "accept":
                out = await service.run(service.market.accept, oid)
            else:
                out = await service.run(service.market.settle, oid)
            await changed()
            return out

        return act

    @endpoint
    async def resolve(request: Request) -> Any:
        out = await service.run(service.resolve, request.path_params["challenge_id"])
        await changed()
        return out

    @endpoint
    async def resolve_whistle(request: Request) -> Any:
        out = await service.run(service.resolve_whistle, request.path_params["whistle_id"])
        await changed()
        return out

    @endpoint
    async def treasury(request: Request) -> Any:
        return await service.run(service.market.treasury)

    @endpoint
    async def events(request: Request) -> Any:
        try:
            after = int(request.query_params.get("after", "-1"))
            limit = min(int(request.query_params.get("limit", "100")), MAX_EVENTS)
            wait = min(float(request.query_params.get("wait", "0")), MAX_WAIT_S)
        except ValueError:
            raise HttpError(400, "BAD_PARAMS", "after, limit and wait must be numbers") from None
        if limit < 1 or not wait >= 0 or not -1 <= after < 2**62:  # NaN fails `>= 0`
            raise HttpError(
                400, "BAD_PARAMS", "limit must be >= 1, wait >= 0 and after in [-1, 2^62)"
            )
        deadline = time.monotonic() + wait
        while True:
            waiter = service._changed
            out = await service.run(service.events, after, limit)
            left = deadline - time.monotonic()
            if out["events"] or left <= 0:
                return out
            try:
                await asyncio.wait_for(waiter.wait(), timeout=left)
            except TimeoutError:
                pass

    @endpoint
    async def audit(request: Request) -> Any:
        check_bls = request.query_params.get("bls", "1") != "0"
        rep = await service.run(lambda: service.market.audit(check_bls=check_bls))
        return rep.to_dict()

    @endpoint
    async def openapi(request: Request) -> Any:
        return OPENAPI

    routes = [
        Route("/v1/market", info, methods=["GET"]),
        Route("/v1/requests", post_request, methods=["POST"]),
        Route("/v1/requests/batch", post_batch, methods=["POST"]),
        Route("/v1/jobs", post_job, methods=["POST"]),
        Route("/v1/bundles", post_bundle, methods=["POST"]),
        Route("/v1/orders", orders, methods=["GET"]),
        Route("/v1/orders/{order_id}", order, methods=["GET"]),
        Route("/v1/orders/{order_id}/row", order_row, methods=["GET"]),
        Route("/v1/orders/{order_id}/explain", explain, methods=["GET"]),
        Route("/v1/orders/{order_id}/redraw", redraw, methods=["POST"]),
        Route("/v1/orders/{order_id}/verify", market_action("verify"), methods=["POST"]),
        Route("/v1/orders/{order_id}/accept", market_action("accept"), methods=["POST"]),
        Route("/v1/orders/{order_id}/settle", market_action("settle"), methods=["POST"]),
        Route("/v1/challenges/{challenge_id}/resolve", resolve, methods=["POST"]),
        Route("/v1/whistles/{whistle_id}/resolve", resolve_whistle, methods=["POST"]),
        Route("/v1/treasury", treasury, methods=["GET"]),
        Route("/v1/balances/{account}", balance, methods=["GET"]),
        Route("/v1/events", events, methods=["GET"]),
        Route("/v1/audit", audit, methods=["GET"]),
        Route("/openapi.json", openapi, methods=["GET"]),
    ]

    async def not_found(request: Request, exc: Exception) -> JSONResponse:
        return error(404, "NOT_FOUND", f"no route {request.method} {request.url.path}")

    async def bad_method(request: Request, exc: Exception) -> JSONResponse:
        return error(405, "METHOD_NOT_ALLOWED", f"{request.method} not allowed here")

    routed = Starlette(routes=routes, exception_handlers={404: not_found, 405: bad_method})
    return _SignedRequests(service, routed, changed)


_JSON_HEADERS = [(b"content-type", b"application/json")]


class _SignedRequests:
    """The ASGI app: ``POST /v1/requests`` (every state change a party makes, the hot path)
    answered directly, everything else by the Starlette router behind it.

    The direct path does what the routed one would (body limit, the service's execute on the
    writer thread, the same status codes and error bodies) without the router and its
    middleware, which cost as much per request as applying the request to the ledger.
    """

    def __init__(self, service: MarketService, routed: Any, changed: Any) -> None:
        self.service, self.routed, self._changed = service, routed, changed
        self.routes = routed.routes

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["path"] != "/v1/requests" or scope["method"] != "POST":
            await self.routed(scope, receive, send)
            return
        try:
            raw = await _read_limited(scope, receive, MAX_REQUEST)
            out = await self.service.run(self.service.execute, raw)
        except HttpError as e:
            status, body = e.status, _error_body(e.reason, e.message)
        except MarketRefused as e:
            status, body = 409, _error_body(e.reason, str(e))
        except FormatError as e:
            status, body = 400, _error_body(e.reason or "MALFORMED", str(e))
        except DkError as e:
            status, body = 400, _error_body("MALFORMED", str(e))
        else:
            await self._changed()
            status, body = 200, json.dumps(out, separators=(",", ":")).encode()
        headers = [*_JSON_HEADERS, (b"content-length", str(len(body)).encode())]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})


def _error_body(reason: str, message: str) -> bytes:
    return json.dumps({"error": {"reason": reason, "message": message}}).encode()


async def _read_limited(scope: Any, receive: Any, limit: int) -> bytes:
    """The request body, refused with 413 past ``limit`` bytes (declared or received)."""
    for name, value in scope["headers"]:
        if name == b"content-length" and (not value.isdigit() or int(value) > limit):
            raise HttpError(413, "TOO_LARGE", f"request body is over {limit} bytes")
    chunks, size = [], 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise HttpError(400, "MALFORMED_REQUEST", "the client went away mid-request")
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise HttpError(413, "TOO_LARGE", f"request body is over {limit} bytes")
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


def _op(summary: str, *, body: str | None = None, params: list[str] | None = None) -> dict:
    op: dict[str, Any] = {
        "summary": summary,
        "responses": {
            "200": {"description": "the result as JSON"},
            "400": {"description": "malformed input", "content": _ERR},
            "409": {"description": "refused by the market", "content": _ERR},
        },
    }
    if params:
        op["parameters"] = [
            {"name": p, "in": "path", "required": True, "schema": {"type": "string"}}
            for p in params
        ]
    if body:
        op["requestBody"] = {"required": True, "content": {body: {"schema": {}}}}
    return op


_ERR = {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}

OPENAPI: dict[str, Any] = {
    "openapi": "3.1.0",
    "info": {"title": "dk market", "version": API_VERSION},
    "paths": {
        "/v1/market": {"get": _op("market id, config, head and the server's time")},
        "/v1/requests": {
            "post": _op("apply one signed request envelope (SPEC V §2)", body="application/json")
        },
        "/v1/requests/batch": {
            "post": _op(
                "apply a JSON array of up to 64 signed envelopes, each in its own transaction,"
                " with its own result (SPEC V §9)",
                body="application/json",
            )
        },
        "/v1/jobs": {"post": _op("upload a job (TOML); returns its job_id", body="text/plain")},
        "/v1/bundles": {"post": _op("upload a bundle as a tar archive", body="application/x-tar")},
        "/v1/orders": {"get": _op("all orders and bids")},
        "/v1/orders/{order_id}": {
            "get": _op("one order, why each bid matched or not", params=["order_id"])
        },
        "/v1/orders/{order_id}/row": {
            "get": _op(
                "the order's ledger row as stored (JSON fields as text)", params=["order_id"]
            )
        },
        "/v1/orders/{order_id}/explain": {
            "get": {
                **_op("the order's challenge policy explained (SPEC V §10)", params=["order_id"]),
                "parameters": [
                    {
                        "name": "order_id",
                        "in": "path",
                        "required": True,
                        "schema": {"type": "string"},
                    },
                    {
                        "name": "intervals",
                        "in": "query",
                        "required": False,
                        "schema": {"type": "integer"},
                    },
                ],
            }
        },
        "/v1/orders/{order_id}/redraw": {
            "post": _op("replace drawn validators that withheld their share", params=["order_id"])
        },
        "/v1/orders/{order_id}/verify": {
            "post": _op("the market's verification of the committed bundle", params=["order_id"])
        },
        "/v1/orders/{order_id}/accept": {
            "post": _op("accept with k attestations", params=["order_id"])
        },
        "/v1/orders/{order_id}/settle": {
            "post": _op("release or refund as the server's clock says", params=["order_id"])
        },
        "/v1/challenges/{challenge_id}/resolve": {
            "post": _op("replay the disputed interval", params=["challenge_id"])
        },
        "/v1/whistles/{whistle_id}/resolve": {
            "post": _op(
                "replay a whistle's interval: slash the attesters or forfeit the deposit",
                params=["whistle_id"],
            )
        },
        "/v1/treasury": {"get": _op("the treasury's inflows, outflows and balance")},
        "/v1/balances/{account}": {"get": _op("free balance of an account", params=["account"])},
        "/v1/events": {
            "get": {
                **_op("events after a sequence number; long-poll with wait (s, ≤ 30)"),
                "parameters": [
                    {"name": n, "in": "query", "required": False, "schema": {"type": t}}
                    for n, t in (("after", "integer"), ("limit", "integer"), ("wait", "number"))
                ],
            }
        },
        "/v1/audit": {"get": _op("re-check the chain, signatures and conservation")},
    },
    "components": {
        "schemas": {
            "Error": {
                "type": "object",
                "required": ["error"],
                "properties": {
                    "error": {
                        "type": "object",
                        "required": ["reason", "message"],
                        "properties": {
                            "reason": {"type": "string"},
                            "message": {"type": "string"},
                        },
                    }
                },
            }
        }
    },
}


def serve(
    db: str | Path,
    *,
    host: str = "127.0.0.1",
    port: int = 8765,
    state_dir: str | Path | None = None,
    ready: Callable[[int], None] | None = None,
) -> None:
    """Run the server until interrupted (what ``dk market serve`` calls).

    Args:
        db: the ledger file.
        host, port: where to listen (port 0 picks a free one).
        state_dir: uploads (default: ``<db>.d`` beside the ledger).
        ready: called with the bound port once the server listens.
    """
    try:
        import uvicorn
    except ImportError:
        raise BackendUnavailable("the market server needs: pip install 'dk-pol[server]'") from None
    from dk.market.store import is_url

    default_state = Path("market-state") if is_url(db) else Path(f"{db}.d")
    socks = _listen(host, port)  # before the ledger is opened: a busy port changes nothing
    service: MarketService | None = None
    try:
        service = MarketService(db, state_dir=state_dir or default_state)
        config = uvicorn.Config(
            create_app(service),
            host=host,
            port=port,
            log_level="warning",
            access_log=False,
            ws="none",
            lifespan="off",
            proxy_headers=False,  # nothing here reads the client's address
        )
        server = uvicorn.Server(config)

        async def main() -> None:
            task = asyncio.create_task(server.serve(sockets=socks))
            while not server.started and not task.done():
                await asyncio.sleep(0.01)
            if ready is not None and server.started:
                ready(server.servers[0].sockets[0].getsockname()[1])
            await task

        _run_loop(main())
    finally:
        if service is not None:
            service.close()
        for sock in socks:
            sock.close()


def _listen(host: str, port: int) -> list[socket.socket]:
    """Listening sockets on ``(host, port)``, bound as asyncio's ``create_server`` (uvicorn's
    own path) binds them: every address ``host`` resolves to (``localhost``: IPv4 and IPv6),
    IPv6 sockets IPv6-only, ``SO_REUSEADDR`` on POSIX only.

    Raises:
        UsageError: an address cannot be bound (in use, not this machine's, no permission) or
            ``host`` does not resolve; nothing stays bound.
    """
    socks: list[socket.socket] = []
    try:
        infos = socket.getaddrinfo(
            host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )
        for family, kind, proto, _, addr in dict.fromkeys(infos):
            sock = socket.socket(family, kind, proto)
            socks.append(sock)
            if os.name == "posix":
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            sock.bind(addr)
            sock.listen(2048)
    except (OSError, OverflowError, UnicodeError) as e:
        for sock in socks:
            sock.close()
        why = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
        hint = "; choose another --port" if getattr(e, "errno", None) == errno.EADDRINUSE else ""
        raise UsageError(f"cannot listen on {host}:{port}: {why}{hint}") from None
    return socks


def _run_loop(main: Any) -> None:
    """Run the server's coroutine on uvloop (libuv) when installed, else on asyncio's loop."""
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop comes with the server extra (not Windows)
        asyncio.run(main)
        return
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(main)


if __name__ == "__main__":  # python -m dk.market.server --openapi > docs/openapi.json
    import sys

    if sys.argv[1:] == ["--openapi"]:
        print(json.dumps(OPENAPI, indent=2, sort_keys=True))
    else:
        print("usage: python -m dk.market.server --openapi  (run the server: dk market serve)")
        raise SystemExit(2)
