"""The dk Flower strategy: verify each client's bundle, aggregate verified updates (SPEC §VII.1).

:class:`DkStrategy` is Flower's ``FedAvg`` with its ``aggregate_fit`` replaced: each result goes
through the PoL gate (:func:`dk.fl.gate.verify_update`); the verified updates
``w_client - w_global`` are combined by a rule of :mod:`dk.fl.aggregators` (FedAvg weighted by
sample counts, median, trimmed mean, Krum, multi-Krum, FLTrust on the coordinator's root data)
and added to the global weights. Every round appends a report to :attr:`DkStrategy.reports`:
accepted clients, rejected clients with their reason codes, and Flower's failures.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from flwr.common import FitRes, Parameters, ndarrays_to_parameters, parameters_to_ndarrays
from flwr.server.client_manager import ClientManager
from flwr.server.client_proxy import ClientProxy
from flwr.server.strategy import FedAvg

from dk.fl.aggregators import make_aggregator
from dk.fl.gate import verify_update
from dk.fl.rounds import param_names, round_job, to_weights, write_weights
from dk.pol.job import JobSpec
from dk.pol.models import initial_state


class DkStrategy(FedAvg):  # type: ignore[misc]
    """FedAvg's client sampling with a PoL gate and a robust aggregation rule."""

    def __init__(
        self,
        template: JobSpec,
        *,
        workdir: Path,
        data_for: Callable[[str], Path | None],
        aggregator: str = "fedavg",
        f: int = 0,
        root_data: Path | None = None,
        beacon: Callable[[], bytes] = lambda: os.urandom(32),
        samples: int | None = None,
        min_clients: int = 2,
    ) -> None:
        self.template, self.workdir = template, Path(workdir)
        self.data_for, self.beacon, self.samples = data_for, beacon, samples
        self.rule = make_aggregator(aggregator, f=f)
        if self.rule.needs_root and root_data is None:
            raise ValueError("fltrust needs the coordinator's root dataset (root_data)")
        self.root_data = root_data
        self.names = param_names(template)
        init = initial_state(template)
        self.global_weights = [init[k] for k in self.names]
        self.reports: list[dict[str, Any]] = []
        super().__init__(
            fraction_fit=1.0,
            fraction_evaluate=0.0,
            min_fit_clients=min_clients,
            min_available_clients=min_clients,
            initial_parameters=ndarrays_to_parameters(self.global_weights),
            on_fit_config_fn=lambda r: {"round": r},
        )

    def _weights_path(self, server_round: int) -> Path:
        return self.workdir / "coordinator" / f"r{server_round}" / "global.safetensors"

    def configure_fit(
        self, server_round: int, parameters: Parameters, client_manager: ClientManager
    ) -> list[tuple[ClientProxy, Any]]:
        """Remember and store the weights sent this round, then sample as FedAvg does."""
        self.global_weights = parameters_to_ndarrays(parameters)
        write_weights(
            self._weights_path(server_round), to_weights(self.template, self.global_weights)
        )
        return super().configure_fit(server_round, parameters, client_manager)  # type: ignore[no-any-return]

    def aggregate_fit(
        self,
        server_round: int,
        results: list[tuple[ClientProxy, FitRes]],
        failures: list[Any],
    ) -> tuple[Parameters | None, dict[str, Any]]:
        """Gate every result, aggregate the verified updates, write the round report."""
        wpath = self._weights_path(server_round)
        base = np.concatenate([w.reshape(-1) for w in self.global_weights]).astype(np.float64)
        accepted, rejected, rows, counts = [], [], [], []
        for _, res in sorted(results, key=lambda cr: str(cr[1].metrics.get("client", ""))):
            try:
                new = to_weights(self.template, parameters_to_ndarrays(res.parameters))
            except Exception as e:  # a malformed update is the client's fault
                rejected.append(
                    {
                        "client": str(res.metrics.get("client", "?")),
                        "codes": ["UPDATE_MALFORMED"],
                        "detail": str(e),
                    }
                )
                continue
            v = verify_update(
                self.template,
                round_index=server_round,
                weights_path=wpath,
                new_weights=new,
                metrics=res.metrics,
                data_for=self.data_for,
                beacon=self.beacon(),
                samples=self.samples,
            )
            if not v.ok:
                rejected.append({"client": v.client, "codes": v.codes, "detail": v.detail})
                continue
            accepted.append(v.client)
            flat = np.concatenate([new[k].reshape(-1) for k in self.names]).astype(np.float64)
            rows.append(flat - base)
            counts.append(res.num_examples)
        report = {
            "round": server_round,
            "accepted": accepted,
            "rejected": rejected,
            "failures": len(failures),
            "aggregator": self.rule.name,
        }
        self.reports.append(report)
        if not rows:
            return ndarrays_to_parameters(self.global_weights), {"accepted": 0}
        root = self._root_update(server_round, wpath, base) if self.rule.needs_root else None
        step = self.rule(np.stack(rows), weights=np.asarray(counts, float), root=root)
        new_flat = (base + step).astype(np.float32)
        out, pos = [], 0
        for w in self.global_weights:
            out.append(new_flat[pos : pos + w.size].reshape(w.shape))
            pos += w.size
        self.global_weights = out
        return ndarrays_to_parameters(out), {"accepted": len(accepted), "rejected": len(rejected)}

    def _root_update(self, server_round: int, wpath: Path, base: np.ndarray) -> np.ndarray:
        """FLTrust: the coordinator trains the round job on its own root data."""
        from dk.pol import train_job
        from dk.pol.checkpoint import model_tensors
        from dk.pol.pack import read_run_checkpoint

        assert self.root_data is not None
        job = round_job(
            self.template, round_index=server_round, weights_path=wpath, data_path=self.root_data
        )
        run = self.workdir / "coordinator" / f"r{server_round}" / "root-run"
        shutil.rmtree(run, ignore_errors=True)
        info = train_job(job, run)
        last = info.checkpoints[-1]
        final = model_tensors(read_run_checkpoint(run, last.root, last.nbytes))
        return np.concatenate([final[k].reshape(-1) for k in self.names]) - base
