"""The coordinator of a secure Flower round (SPEC §VII.2): a Flower ``Server`` whose
``fit_round`` runs the four secure-aggregation stages of :mod:`dk.fl.secure_round`."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import numpy as np
from flwr.server import Server

from dk.crypto.keys import VerifyKey
from dk.fl.field import dequantize
from dk.fl.secagg import Advert, SecAggError, SecAggServer, UnmaskResponse
from dk.fl.secure_round import (
    ADMISSION_INVALID,
    MASKED_INPUT_MISMATCH,
    RoundVerifier,
    SecAggConfig,
    admission_message,
    field_from_bytes,
    flat,
    masked_message,
    pack_adverts,
    pack_blobs,
    pack_indices,
    unpack_blobs,
)
from dk.fl.shamir import SHARE_BYTES
from dk.fl.strategy import DkStrategy


class SecAggFlowerServer(Server):  # type: ignore[misc]
    """A Flower ``Server`` whose round is the four secure-aggregation stages (SPEC §VII.2).

    ``strategy`` must be a :class:`dk.fl.strategy.DkStrategy` with the FedAvg rule: it samples
    clients and writes the round's weights file; this server aggregates.
    """

    def __init__(
        self,
        *,
        strategy: DkStrategy,
        verifier: RoundVerifier,
        config: SecAggConfig,
        client_manager: Any | None = None,
    ) -> None:
        from flwr.server import SimpleClientManager

        if strategy.rule.name != "fedavg":
            raise ValueError("secure aggregation sums updates: only the fedavg rule applies")
        super().__init__(client_manager=client_manager or SimpleClientManager(), strategy=strategy)
        self.dk_strategy = strategy
        self.verifier, self.cfg = verifier, config
        self.trusted: VerifyKey = verifier.verify_key
        self._timeout: float | None = config.timeout

    def _exchange(
        self, r: int, ins: Mapping[int, Any], proxies: Mapping[int, Any], report: dict[str, Any]
    ) -> dict[int, dict[str, Any]]:
        """One stage: ``FitIns`` to the given clients; their metrics by client index. A client
        that fails or does not answer is absent (a dropout); failures are counted."""
        from flwr.common import Code
        from flwr.server.server import fit_clients

        results, failures = fit_clients(
            client_instructions=[(proxies[u], ins[u]) for u in sorted(ins)],
            max_workers=self.max_workers,
            timeout=self._timeout,
            group_id=r,
        )
        report["failures"] += len(failures)
        by_proxy = {id(p): u for u, p in proxies.items()}
        out: dict[int, dict[str, Any]] = {}
        for proxy, res in results:
            u = by_proxy.get(id(proxy))
            if u is not None and res.status.code == Code.OK:
                out[u] = dict(res.metrics)
        return out

    def fit_round(self, server_round: int, timeout: float | None) -> Any:
        """Run the four stages; on :class:`SecAggError` keep the weights and report why."""
        from flwr.common import ndarrays_to_parameters

        strat = self.dk_strategy
        sampled = strat.configure_fit(server_round, self.parameters, self._client_manager)
        if not sampled:
            return None
        proxies = dict(enumerate(sorted((p for p, _ in sampled), key=lambda p: str(p.cid))))
        n = len(proxies)
        report: dict[str, Any] = {
            "round": server_round,
            "accepted": [],
            "rejected": [],
            "dropped": [],
            "failures": 0,
            "aggregator": "secagg+" if self.cfg.plus else "secagg",
        }
        strat.reports.append(report)
        self._timeout = self.cfg.timeout if self.cfg.timeout is not None else timeout
        try:
            try:
                degree, t = self.cfg.shape(n)
            except ValueError as e:  # fewer clients sampled than the settings need
                raise SecAggError(f"secure aggregation: {e}") from None
            report["secagg"] = {"n": n, "t": t, "degree": degree if degree is not None else n - 1}
            new = self._secure_round(server_round, proxies, degree, t, report)
        except SecAggError as e:
            report["error"] = str(e)
            return None
        finally:
            report["rejected"].sort(key=lambda x: x["client"])
            report["dropped"].sort()
        strat.global_weights = new
        return ndarrays_to_parameters(new), {"accepted": len(report["accepted"])}, ([], [])

    def _secure_round(
        self,
        r: int,
        proxies: Mapping[int, Any],
        degree: int | None,
        t: int,
        report: dict[str, Any],
    ) -> list[np.ndarray]:
        from flwr.common import FitIns, Parameters

        strat, cfg, n = self.dk_strategy, self.cfg, len(proxies)
        session = os.urandom(32)
        wpath = strat._weights_path(r)
        base = flat(strat.names, dict(zip(strat.names, strat.global_weights, strict=True)))
        common: dict[str, bool | bytes | float | int | str] = {
            "round": r,
            "session": session,
            "n": n,
            "t": t,
            "degree": degree or 0,
            "scale": cfg.scale,
            "clip": cfg.clip,
        }
        empty = Parameters(tensors=[], tensor_type="numpy.ndarray")
        names: dict[int, str] = {}

        def ins(u: int, stage: str, params: Any = empty, **extra: Any) -> Any:
            return FitIns(params, {**common, "stage": stage, "index": u, **extra})

        # Stage 0: train, prove, advertise; the verifier admits.
        got = self._exchange(
            r, {u: ins(u, "advertise", self.parameters) for u in proxies}, proxies, report
        )
        adverts: dict[int, Advert] = {}
        commits: dict[int, bytes] = {}
        for u in sorted(got):
            m = got[u]
            names[u] = str(m.get("client", f"#{u}"))[:64]
            verdict, sig = self.verifier.admit(
                round_index=r,
                weights_path=wpath,
                base=base,
                session=session,
                index=u,
                n=n,
                scale=cfg.scale,
                clip=cfg.clip,
                metrics=m,
            )
            if sig is None:
                report["rejected"].append(
                    {"client": verdict.client, "codes": verdict.codes, "detail": verdict.detail}
                )
                continue
            adv = Advert(m["c_pk"], m["s_pk"])
            signed = admission_message(
                session, u, sig.job_id, bytes.fromhex(sig.worker_key), adv, m["b_commit"]
            )
            if not self.trusted.verify(sig.signature, signed):
                report["rejected"].append(
                    {"client": names[u], "codes": [ADMISSION_INVALID], "detail": "bad signature"}
                )
                continue
            adverts[u], commits[u] = adv, m["b_commit"]
        report["dropped"] += [f"#{u}" for u in sorted(set(proxies) - set(got))]
        dim = base.size
        sa = SecAggServer(n=n, t=t, dim=dim, session=session, degree=degree, b_commits=commits)
        keys = sa.collect_adverts(adverts)
        key_list = pack_adverts(keys)
        # Stage 1: share keys.
        got = self._exchange(
            r, {u: ins(u, "share", adverts=key_list) for u in keys}, proxies, report
        )
        outboxes = {}
        for u, m in got.items():
            try:
                outboxes[u] = unpack_blobs(m.get("shares"), n)
            except SecAggError:
                report["dropped"].append(names[u])
        inbox = sa.route_shares(outboxes)
        # Stage 2: masked inputs, each attested by the client's verifier.
        got = self._exchange(
            r, {u: ins(u, "mask", inbox=pack_blobs(inbox[u])) for u in inbox}, proxies, report
        )
        masked = {}
        for u in sorted(got):
            m = got[u]
            y = m.get("masked")
            att = self.verifier.attest_masked(
                session=session,
                index=u,
                request=m.get("vreq"),
                peers=m.get("peers"),
                y=y if isinstance(y, bytes) else b"",
                n=n,
            )
            ok = att is not None and self.trusted.verify(
                att[1],
                masked_message(session, u, att[0], key_list, m["peers"], m["masked"]),
            )
            if not ok:
                report["rejected"].append(
                    {
                        "client": names[u],
                        "codes": [MASKED_INPUT_MISMATCH],
                        "detail": "masked input is not the proven update, masked",
                    }
                )
                continue
            masked[u] = field_from_bytes(m["masked"], dim)
        report["dropped"] += [names[u] for u in sorted(set(inbox) - set(got))]
        u3, dropped = sa.collect_masked(masked)
        # Stage 3: unmask.
        sets = {"survivors": pack_indices(u3), "dropped": pack_indices(dropped)}
        got = self._exchange(r, {u: ins(u, "unmask", **sets) for u in u3}, proxies, report)
        responses = {}
        for u, m in got.items():
            try:
                responses[u] = UnmaskResponse(
                    b_shares=unpack_blobs(m.get("b_shares"), n, SHARE_BYTES),
                    s_shares=unpack_blobs(m.get("s_shares"), n, SHARE_BYTES),
                )
            except SecAggError:
                continue
        total = sa.unmask(responses)
        mean = dequantize(total, scale=cfg.scale) / len(u3)
        report["accepted"] = sorted(names[u] for u in u3)
        new_flat = (base + mean).astype(np.float32)
        out, pos = [], 0
        for w in strat.global_weights:
            out.append(new_flat[pos : pos + w.size].reshape(w.shape))
            pos += w.size
        return out
