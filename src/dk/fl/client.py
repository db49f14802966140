"""The dk Flower client: local training recorded as a PoL transcript, update + bundle (SPEC §VII.1).

Each round the client builds its round job (:func:`dk.fl.rounds.round_job`) from the template,
the global weights it received and its own data file, trains it with dk's Recorder
(:func:`dk.pol.train_job`), signs a bundle with its key (:func:`dk.prover.prove_run`) and returns
the final checkpoint's weights with, in the fit metrics, ``bundle`` (packed bytes),
``data_root`` and ``client`` (its name). Its data never leaves it; only the party it lets verify
(``data_for`` on the coordinator's side) needs a copy.

In a secure round (SPEC §VII.2) the coordinator's ``config`` names a ``stage`` and the client
answers with that stage's message (:func:`dk.fl.secure_round.client_stage`); its weights never
leave it. Its round secrets live in a :class:`~dk.fl.secure_round.StateStore` (Flower's
``Context.state`` in the Ray simulation, where a client object lives for one message).

``behaviour`` makes dishonest clients for tests and the benchmark: ``"lazy"`` trains once, then
stops training (returns the global weights plus noise and re-sends its first bundle),
``"mismatch"`` trains and proves but returns (or, in a secure round, masks) other weights than
it proved, ``"drop"`` goes silent in a secure round's masking stage.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import numpy as np
from flwr.client import NumPyClient

from dk.crypto.keys import SigningKey
from dk.fl.rounds import param_names, round_job, to_weights, write_weights
from dk.fl.wire import pack_bundle
from dk.pol.checkpoint import blob_name, model_tensors, parse_blob, read_blob_file
from dk.pol.data import load_npz
from dk.pol.job import JobSpec
from dk.pol.models import initial_state

BEHAVIOURS = ("honest", "lazy", "mismatch", "drop")


class DkClient(NumPyClient):  # type: ignore[misc]
    """A Flower ``NumPyClient`` that proves its local training."""

    def __init__(
        self,
        template: JobSpec,
        *,
        data_path: Path,
        key: SigningKey,
        workdir: Path,
        name: str,
        behaviour: str = "honest",
        context: Any | None = None,
    ) -> None:
        if behaviour not in BEHAVIOURS:
            raise ValueError(f"behaviour must be one of {', '.join(BEHAVIOURS)}")
        self.template, self.data_path, self.key = template, Path(data_path), key
        self.workdir, self.name, self.behaviour = Path(workdir), name, behaviour
        self.data_root = load_npz(self.data_path).root().hex()
        self._last_bundle: bytes | None = None
        from dk.fl.secure_round import StateStore

        self.store = StateStore(context)

    def get_parameters(self, config: dict[str, Any]) -> list[np.ndarray]:
        """The template's initial weights (Flower asks one client when the strategy has none)."""
        w = initial_state(self.template)
        return [w[k] for k in param_names(self.template)]

    def fit(
        self, parameters: list[np.ndarray], config: dict[str, Any]
    ) -> tuple[list[np.ndarray], int, dict[str, Any]]:
        """Train this round's job from ``parameters``; return the update and its bundle (or,
        when ``config`` names a secure-aggregation stage, that stage's message)."""
        if "stage" in config:
            from dk.fl.secure_round import client_stage

            return client_stage(
                self._train,
                parameters,
                config,
                self.store,
                behaviour=self.behaviour,
            )
        return self._train(parameters, int(config.get("round", 0)))

    def _train(
        self, parameters: list[np.ndarray], r: int
    ) -> tuple[list[np.ndarray], int, dict[str, Any]]:
        from dk.pol import train_job
        from dk.prover import prove_run

        names = param_names(self.template)
        n = len(load_npz(self.data_path))
        metrics: dict[str, Any] = {"client": self.name, "data_root": self.data_root}
        if self.behaviour == "lazy" and self._last_bundle is not None:
            rng = np.random.default_rng(r)
            out = [p + rng.normal(0, 1e-2, p.shape).astype(np.float32) for p in parameters]
            metrics["bundle"] = self._last_bundle
            return out, n, metrics
        rdir = self.workdir / self.name / f"r{r}"
        if rdir.exists():
            shutil.rmtree(rdir)
        wpath = write_weights(rdir / "global.safetensors", to_weights(self.template, parameters))
        job = round_job(self.template, round_index=r, weights_path=wpath, data_path=self.data_path)
        info = train_job(job, rdir / "run")
        bundle = prove_run(rdir / "run", job, self.key, rdir / "bundle")
        final_blob = bundle / blob_name(bytes.fromhex(info.checkpoints[-1].root))
        final = model_tensors(parse_blob(read_blob_file(final_blob)))
        out = [final[k] for k in names]
        if self.behaviour == "mismatch":
            out = [p + (p - q) for p, q in zip(out, parameters, strict=True)]  # 2× the update
        metrics["bundle"] = self._last_bundle = pack_bundle(bundle)
        shutil.rmtree(rdir / "run", ignore_errors=True)
        return out, n, metrics
