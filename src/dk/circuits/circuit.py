"""A compiled, checked, keyed circuit for one SGD step (SPEC IV §4).

``StepCircuit.build`` exports the step graph, checks it against the float step, calibrates
with pinned scales, compiles, and refuses the circuit unless its decoded outputs stay within
the documented bound of the float step (:func:`dk.circuits.fidelity.check_bound`). Files live in
``workdir/circuits/<circuit_id>``; keys live in ``workdir/keys/<key_id>`` where ``key_id``
hashes the circuit id, the (canonicalised) settings and the SRS, so a change to any of them
makes new keys. ``step`` runs the circuit's fixed-point step (what zk-mode training commits);
``prove_step`` proves it; ``dk.circuits.statement`` checks proofs.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from dk.circuits import ezkl_backend as eb
from dk.circuits.export import build_step_graph, check_export
from dk.circuits.fidelity import TAG_CALIBRATION, Fidelity, calibration_batch, check_bound
from dk.circuits.quantize import dequantize, felts_to_array, quantize, tensor_digest
from dk.circuits.reasons import CircuitError
from dk.circuits.spec import SOFTMAX_CLAMP, StepSpec, batch_arrays, check_params
from dk.circuits.srs import Srs, file_sha256, local_srs, pinned_srs
from dk.crypto.canonical_json import canonical_json
from dk.crypto.hashing import tagged_hash

TAG_CIRCUIT_ID = "dk/v1/circuits/circuit-id"
TAG_KEY_ID = "dk/v1/circuits/key-id"
PROOF_VERSION = 1


class StepCircuit:
    """A step circuit ready to run, prove and verify; build it with :meth:`build`."""

    def __init__(
        self,
        spec: StepSpec,
        zs: eb.ZkSettings,
        circuit_id: str,
        directory: Path,
        settings: dict,
        srs: Srs,
        key_dir: Path,
        fidelity: Fidelity,
    ) -> None:
        self.spec, self.zk, self.circuit_id = spec, zs, circuit_id
        self.directory, self.settings, self.srs = directory, settings, srs
        self.key_dir, self.fidelity = key_dir, fidelity

    @classmethod
    def build(
        cls,
        *,
        model: Mapping[str, Any],
        loss: str,
        lr: float,
        batch_size: int,
        workdir: str | Path,
        srs: str | Path | None = None,
        srs_sha256: str | None = None,
        srs_kind: str = "local",
        settings: eb.ZkSettings | None = None,
    ) -> StepCircuit:
        """Export, check, calibrate and compile the step circuit (cached under ``workdir``).

        Args:
            model: registry model description (see :class:`dk.circuits.spec.StepSpec`).
            loss: ``"mse"`` or ``"cross_entropy"``.
            lr: SGD learning rate of the job.
            batch_size: rows per batch.
            workdir: cache directory for circuits, keys and the local SRS.
            srs: a supplied SRS file, or None for a locally generated (insecure) SRS.
            srs_sha256: the pin of ``srs`` (required with ``srs``).
            srs_kind: ``"local"`` (default: someone's locally generated file; proofs checked
                with it are flagged insecure) or ``"ceremony"`` (the caller vouches for its
                origin).
            settings: circuit knobs; defaults to ``ZkSettings()``.

        Returns:
            The circuit. Keys are made on first use (``setup`` is the slow part).

        Raises:
            FormatError: on a bad model description.
            CircuitError: when EZKL fails or the circuit miscomputes.
            BackendUnavailable: without ezkl/onnx.
        """
        spec = StepSpec.from_model(model, loss=loss, lr=lr, batch_size=batch_size)
        zs = settings or eb.ZkSettings()
        graph = build_step_graph(spec).SerializeToString()
        ident = canonical_json(
            {
                "spec": spec.canonical(),
                "settings": zs.canonical(),
                "ezkl": eb.ezkl_version(),
                "onnx_sha256": hashlib.sha256(graph).hexdigest(),
            }
        )
        circuit_id = tagged_hash(TAG_CIRCUIT_ID, ident).hex()
        root = Path(workdir)
        d = root / "circuits" / circuit_id
        params, x, labels = calibration_batch(spec, tagged_hash(TAG_CALIBRATION, ident))
        xs, ys = batch_arrays(spec, x, labels)
        check_export(graph, spec, params, xs, ys)
        floor = -int(SOFTMAX_CLAMP * 2**zs.scale) if spec.loss == "cross_entropy" else None
        cfg = _compiled(d, graph, _input_json(spec, zs, params, xs, ys), zs, floor)
        logrows = int(cfg["run_args"]["logrows"])
        the_srs = (
            pinned_srs(srs, srs_sha256, srs_kind)
            if srs is not None
            else local_srs(root / "srs", logrows)
        )
        # The compiled file is not byte-reproducible (EZKL serialises hash maps), but it is a
        # function of the graph, the settings and the EZKL version: circuit_id + settings.
        key_id = tagged_hash(
            TAG_KEY_ID,
            bytes.fromhex(circuit_id),
            canonical_json(cfg),
            bytes.fromhex(the_srs.sha256),
        ).hex()
        circ = cls(
            spec, zs, circuit_id, d, cfg, the_srs, root / "keys" / key_id, Fidelity(0.0, 0.0)
        )
        _, _, circ.fidelity = circ._run(params, xs, ys)
        return circ

    # -- paths and keys -----------------------------------------------------------------

    @property
    def logrows(self) -> int:
        """log2 of the circuit's rows."""
        return int(self.settings["run_args"]["logrows"])

    @property
    def compiled_path(self) -> Path:
        """The compiled circuit file."""
        return self.directory / "step.ezkl"

    @property
    def settings_path(self) -> Path:
        """The settings file."""
        return self.directory / "settings.json"

    def keys(self) -> tuple[Path, Path]:
        """``(vk, pk)`` paths, running EZKL ``setup`` the first time (cached by key id)."""
        vk, pk = self.key_dir / "vk.key", self.key_dir / "pk.key"
        if not (vk.exists() and pk.exists()):
            self.key_dir.mkdir(parents=True, exist_ok=True)
            eb.setup_keys(self.compiled_path, self.srs.path, vk, pk)
        return vk, pk

    # -- digests --------------------------------------------------------------------------

    @property
    def digest_kind(self) -> str:
        """``"poseidon"`` with hashed visibility (in-circuit hash), else ``"sha256"``."""
        return "poseidon" if self.zk.visibility == "hashed" else "sha256"

    def params_digest(self, params: Mapping[str, np.ndarray]) -> str:
        """Digest of quantised parameters (what a zk checkpoint commitment carries)."""
        return tensor_digest(check_params(self.spec, params), self.zk.scale, self.digest_kind)

    def batch_digest(self, x: np.ndarray, y: np.ndarray) -> str:
        """Digest of the quantised batch ``{"x": x, "y": targets}``."""
        xs, ys = batch_arrays(self.spec, x, y)
        return tensor_digest({"x": xs, "y": ys}, self.zk.scale, self.digest_kind)

    # -- running --------------------------------------------------------------------------

    def step(
        self, params: Mapping[str, np.ndarray], x: np.ndarray, y: np.ndarray
    ) -> dict[str, np.ndarray]:
        """The circuit's fixed-point SGD step, decoded exactly to float32.

        zk-mode training commits these values, so that the committed checkpoint's digest is
        the proof's output digest.

        Raises:
            CircuitError: when the output leaves the documented bound of the float step.
        """
        xs, ys = batch_arrays(self.spec, x, y)
        out, _, _ = self._run(check_params(self.spec, params), xs, ys)
        return out

    def _run(
        self,
        params: dict[str, np.ndarray],
        xs: np.ndarray,
        ys: np.ndarray,
        keep: Path | None = None,
    ) -> tuple[dict[str, np.ndarray], dict, Fidelity]:
        """Generate the witness (kept at ``keep`` if given), decode and bound-check it."""
        s = self.zk.scale
        with tempfile.TemporaryDirectory(dir=self.directory) as tmp:
            data = Path(tmp) / "input.json"
            eb.write_json(data, _input_json(self.spec, self.zk, params, xs, ys))
            witness = eb.gen_witness(self.compiled_path, data, keep or Path(tmp) / "witness.json")
        shapes = self.spec.param_shapes()
        outputs = witness.get("outputs", [])
        if len(outputs) != len(shapes):
            raise CircuitError("circuit: the witness does not hold one output per parameter")
        out_q = {
            k: felts_to_array(o, shape)
            for (k, shape), o in zip(shapes.items(), outputs, strict=True)
        }
        params_q = {k: quantize(v, s) for k, v in params.items()}
        fid = check_bound(self.spec, self.zk, params_q, quantize(xs, s), quantize(ys, s), out_q)
        return {k: dequantize(v, s) for k, v in out_q.items()}, witness, fid

    def prove_step(
        self, params: Mapping[str, np.ndarray], x: np.ndarray, y: np.ndarray
    ) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
        """Prove one step; return the proof record and the new parameters.

        Returns:
            ``(record, new_params)``: ``record`` is JSON-serialisable (SPEC IV §6.1).
        """
        from dk.circuits.statement import claims_from_instances

        xs, ys = batch_arrays(self.spec, x, y)
        p = check_params(self.spec, params)
        _, pk = self.keys()
        with tempfile.TemporaryDirectory(dir=self.directory) as tmp:
            wit = Path(tmp) / "witness.json"
            out, _, _ = self._run(p, xs, ys, keep=wit)
            raw = eb.prove(wit, self.compiled_path, pk, self.srs.path, Path(tmp) / "proof.json")
        instances = [str(v) for v in raw["instances"][0]]
        record = {
            "version": PROOF_VERSION,
            "circuit_id": self.circuit_id,
            "srs_sha256": self.srs.sha256,
            "srs_kind": self.srs.kind,
            "claims": claims_from_instances(self, instances),
            "instances": instances,
            "proof": bytes(raw["proof"]).hex(),
        }
        return record, out


def _input_json(
    spec: StepSpec,
    zs: eb.ZkSettings,
    params: Mapping[str, np.ndarray],
    xs: np.ndarray,
    ys: np.ndarray,
) -> dict:
    """EZKL input file: canonically quantised values, given as exact floats ``q * 2**-s``."""
    s = zs.scale
    tensors = [params[k] for k in spec.param_shapes()] + [xs, ys]
    return {
        "input_data": [
            np.ldexp(quantize(t, s).astype(np.float64), -s).ravel().tolist() for t in tensors
        ]
    }


def _compiled(
    d: Path, graph: bytes, calibration: dict, zs: eb.ZkSettings, softmax_floor: int | None
) -> dict:
    """Calibrate and compile into ``d`` unless a complete earlier build is there; settings."""
    marker = d / "built.json"
    onnx_sha = hashlib.sha256(graph).hexdigest()
    if marker.exists():
        try:
            done = json.loads(marker.read_text())
            if (
                done.get("onnx_sha256") == onnx_sha
                and file_sha256(d / "step.ezkl") == done.get("compiled_sha256")
                and file_sha256(d / "settings.json") == done.get("settings_sha256")
            ):
                return dict(json.loads((d / "settings.json").read_text()))
        except (OSError, ValueError):
            pass  # incomplete or damaged cache: rebuild below
    d.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=d) as tmp:
        t = Path(tmp)
        (t / "step.onnx").write_bytes(graph)
        eb.write_json(t / "calibration.json", calibration)
        cfg = eb.make_settings(
            t / "step.onnx", t / "calibration.json", t / "settings.json", zs, softmax_floor
        )
        eb.compile_circuit(t / "step.onnx", t / "settings.json", t / "step.ezkl")
        for name in ("step.onnx", "calibration.json", "settings.json", "step.ezkl"):
            os.replace(t / name, d / name)
    eb.write_json(
        marker,
        {
            "onnx_sha256": onnx_sha,
            "compiled_sha256": file_sha256(d / "step.ezkl"),
            "settings_sha256": file_sha256(d / "settings.json"),
        },
    )
    return cfg
