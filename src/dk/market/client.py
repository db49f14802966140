"""A client of ``dk market serve``: the same calls as the embedded market, over HTTP.

Errors come back as the library's own exceptions with the server's reason code, so code that
handles :class:`~dk.market.errors.MarketRefused` and :class:`~dk.errors.FormatError` works
against either. The client checks on connect that the server runs the market it expects
(``market_id``), so a request is never sent to a fork or another market by mistake.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from dk.crypto.canonical_json import canonical_json
from dk.errors import DkError, FormatError, ServiceUnavailable, UsageError
from dk.market.errors import MarketRefused
from dk.market.transfer import pack_bundle

DEFAULT_TIMEOUT_S = 120.0


class RemoteMarket:
    """One connection to a market server.

    Args:
        url: the server's base URL, e.g. ``http://127.0.0.1:8765``.
        market_id: if given, the server must run this market (else ``WRONG_MARKET``).
        timeout: seconds per request (verification can take a while).

    Raises:
        UsageError: ``url`` is not an ``http://`` or ``https://`` URL with a host.
    """

    def __init__(
        self, url: str, *, market_id: bytes | None = None, timeout: float = DEFAULT_TIMEOUT_S
    ) -> None:
        import httpx

        try:
            parts = urlsplit(url)
            named = parts.scheme in ("http", "https") and bool(parts.hostname)
            _ = parts.port  # a port that is not a number raises here
        except ValueError:
            named = False
        if not named:
            raise UsageError(f"--url {url!r} is not a market server's URL (http://host:port)")
        self.url = url.rstrip("/")
        self._http = httpx.Client(base_url=self.url, timeout=timeout)
        try:
            info = self._get("/v1/market")
        except Exception:
            self._http.close()
            raise
        self.market_id = bytes.fromhex(info["market_id"])
        if market_id is not None and market_id != self.market_id:
            self._http.close()
            raise MarketRefused("WRONG_MARKET", f"{self.url} runs another market")

    def close(self) -> None:
        """Close the connection pool."""
        self._http.close()

    def __enter__(self) -> RemoteMarket:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _answer(self, resp: Any) -> Any:
        try:
            value = resp.json()
        except ValueError:
            raise DkError(f"market server answered {resp.status_code} without JSON") from None
        if resp.status_code == 200:
            return value
        err = value.get("error", {}) if isinstance(value, dict) else {}
        reason, message = err.get("reason", "HTTP_ERROR"), err.get("message", "")
        if resp.status_code in (400, 413):
            raise FormatError(message or reason, reason=reason)
        raise MarketRefused(reason, message)

    def _send(self, method: str, path: str, **kw: Any) -> Any:
        import httpx

        try:
            resp = self._http.request(method, path, **kw)
        except httpx.TransportError as e:
            raise ServiceUnavailable(f"market server {self.url} unreachable: {e}") from None
        return self._answer(resp)

    def _get(self, path: str, **params: Any) -> Any:
        return self._send("GET", path, params=params or None)

    def _post(self, path: str, content: bytes = b"", ctype: str = "application/json") -> Any:
        return self._send("POST", path, content=content, headers={"content-type": ctype})

    def info(self) -> dict[str, Any]:
        """Market id, configuration, head and the server's time."""
        return self._get("/v1/market")

    def now(self) -> int:
        """The server's time (the market's own clock)."""
        return int(self.info()["now"])

    @property
    def config(self) -> Any:
        """The market's configuration (from its genesis event)."""
        from dk.market.config import MarketConfig

        return MarketConfig.from_dict(self.info()["config"])

    @property
    def verifier(self) -> Any:
        """A validator verifies on its own machine: the local :func:`verify_bundle`."""
        from dk.verifier import verify_bundle

        return verify_bundle

    def order(self, order_id: str) -> dict[str, Any]:
        """The order's ledger row as stored (what :meth:`Market.order` returns)."""
        return self._get(f"/v1/orders/{order_id}/row")

    def redraw(self, order_id: str) -> dict[str, Any]:
        """Replace drawn validators that withheld their beacon share past the deadline."""
        return self._post(f"/v1/orders/{order_id}/redraw")

    def execute(self, request: dict[str, Any] | bytes) -> dict[str, Any]:
        """Send one signed request envelope; returns the event data."""
        raw = request if isinstance(request, bytes) else canonical_json(request)
        return self._post("/v1/requests", raw)

    def execute_batch(self, requests: list[dict[str, Any] | bytes]) -> list[dict[str, Any]]:
        """Send several signed envelopes in one POST; each is applied on its own.

        Returns:
            One entry per envelope, in order: ``{"ok": DATA}`` or
            ``{"error": {"reason": CODE, "message": TEXT}}``.
        """
        raws = [r if isinstance(r, bytes) else canonical_json(r) for r in requests]
        return list(self._post("/v1/requests/batch", b"[" + b",".join(raws) + b"]")["results"])

    def upload_job(self, job_path: str | Path) -> str:
        """Upload ``job.toml``; returns its job id (hex)."""
        return self._post("/v1/jobs", Path(job_path).read_bytes(), "text/plain")["job_id"]

    def upload_bundle(self, bundle_dir: str | Path) -> dict[str, str]:
        """Upload a bundle directory; returns its ``manifest_digest`` and ``transcript_root``."""
        return self._post("/v1/bundles", pack_bundle(bundle_dir), "application/x-tar")

    def deliver(self, order_id: str, worker: str, bundle_dir: str | Path) -> dict[str, str]:
        """Upload ``bundle_dir`` (the server checks it and keeps it) and return the ``submit``
        parameters committing it for ``order_id``: the server refuses a submit whose bundle
        it does not hold (SPEC V §5.1). ``worker`` is the server's to check at the submit."""
        held = self.upload_bundle(bundle_dir)
        root, digest = held["transcript_root"], held["manifest_digest"]
        return {"order_id": order_id, "transcript_root": root, "manifest_digest": digest}

    def _upload(self, bundle_dir: str | Path | None, job: Any) -> None:
        if job is not None:
            text = Path(job).read_bytes() if isinstance(job, str | Path) else job.to_toml()
            self._post("/v1/jobs", text if isinstance(text, bytes) else text.encode(), "text/plain")
        if bundle_dir is not None:
            self.upload_bundle(bundle_dir)

    def verify_result(
        self, order_id: str, bundle_dir: str | Path | None = None, job: Any = None
    ) -> dict[str, Any]:
        """The market's own verification of the bundle committed for ``order_id``.

        The server verifies its own copies: ``bundle_dir`` and ``job`` (a JobSpec or the path
        of ``job.toml``), when given, are uploaded first.
        """
        self._upload(bundle_dir, job)
        return self._post(f"/v1/orders/{order_id}/verify")

    def accept(self, order_id: str) -> dict[str, Any]:
        """Accept a verified order with its attestations."""
        return self._post(f"/v1/orders/{order_id}/accept")

    def resolve_whistle(
        self, whistle_id: str, bundle_dir: str | Path | None = None, job: Any = None
    ) -> dict[str, Any]:
        """Replay a whistle's interval (uploading the bundle and job if given)."""
        self._upload(bundle_dir, job)
        return self._post(f"/v1/whistles/{whistle_id}/resolve")

    def treasury(self) -> dict[str, Any]:
        """The treasury's inflows and outflows by kind, and its balance."""
        return self._get("/v1/treasury")

    def settle(self, order_id: str) -> dict[str, Any]:
        """Release or refund ``order_id`` as the server's clock says."""
        return self._post(f"/v1/orders/{order_id}/settle")

    def resolve_challenge(
        self, challenge_id: str, bundle_dir: str | Path | None = None, job: Any = None
    ) -> dict[str, Any]:
        """Replay the interval a challenge disputes (uploading the bundle and job if given)."""
        self._upload(bundle_dir, job)
        return self._post(f"/v1/challenges/{challenge_id}/resolve")

    def show(self, order_id: str) -> dict[str, Any]:
        """One order with the explanation of every bid."""
        return self._get(f"/v1/orders/{order_id}")

    def explain(self, order_id: str, *, intervals: int | None = None) -> dict[str, Any]:
        """The order's challenge policy explained (SPEC V §10)."""
        params = {} if intervals is None else {"intervals": intervals}
        return self._get(f"/v1/orders/{order_id}/explain", **params)

    def book(self) -> dict[str, Any]:
        """All orders and bids."""
        return self._get("/v1/orders")

    def balance(self, account: str) -> int:
        """Free balance of ``account`` (hex public key)."""
        return int(self._get(f"/v1/balances/{account}")["balance"])

    def events(self, after: int = -1, *, limit: int = 100, wait: float = 0.0) -> dict[str, Any]:
        """Events after ``after``; with ``wait`` the server holds the call until one arrives."""
        return self._get("/v1/events", after=after, limit=limit, wait=wait)

    def audit(self, *, check_bls: bool = True) -> RemoteAudit:
        """The server's audit of its own ledger."""
        return RemoteAudit(self._get("/v1/audit", bls=1 if check_bls else 0))


class RemoteAudit(dict):  # type: ignore[type-arg]
    """An audit report received from a server (a dict with ``ok`` and ``problems``)."""

    @property
    def ok(self) -> bool:
        """True iff the server's ledger passed every check."""
        return bool(self.get("ok"))

    @property
    def problems(self) -> list[str]:
        """What failed."""
        return list(self.get("problems", []))

    def to_dict(self) -> dict[str, Any]:
        """JSON form."""
        return dict(self)


def open_market(db: str | Path, *, url: str | None = None, clock: Any = None) -> Any:
    """The market a command talks to: the server at ``url``, else the ledger ``db``.

    Raises:
        MarketRefused: ``CLOCK_LOCKED`` when a clock is given for a server (it keeps its own).
    """
    if url:
        if clock is not None:
            raise MarketRefused(
                "CLOCK_LOCKED", "a market server keeps its own time; --now is for test ledgers"
            )
        return RemoteMarket(url)
    from dk.market.market import Market

    return Market(db, clock=clock)
