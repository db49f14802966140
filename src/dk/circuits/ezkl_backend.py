"""Thin, file-based wrapper over the EZKL pipeline (SPEC IV §4).

settings -> calibration -> compile -> setup -> witness -> prove -> verify. Every run
argument that changes what the circuit computes is pinned here, never left to calibration:
``input_scale = param_scale = scale`` and ``scale_rebase_multiplier = 1`` (calibration's
default multiplier list can pick a setting in which the circuit computes the wrong thing
while its proofs still verify; see :mod:`dk.circuits.circuit` for the output-bound check that
backs this up). Calibration only chooses ``logrows`` and the lookup range.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from dk.circuits.reasons import CircuitError
from dk.errors import BackendUnavailable

VISIBILITIES = ("public", "hashed")
#: Settings fields that carry no meaning for the circuit and are normalised before hashing.
VOLATILE_SETTINGS = ("timestamp",)
#: Settings lists that EZKL fills from hash sets (their order is not reproducible).
SET_VALUED_SETTINGS = ("required_range_checks", "required_lookups")


def ezkl_module():  # type: ignore[no-untyped-def]
    """Import EZKL, or raise ``BackendUnavailable`` with the install hint."""
    try:
        import ezkl
    except ImportError as e:  # pragma: no cover - exercised only without the zk extra
        raise BackendUnavailable("zk proofs need ezkl: pip install 'dk-pol[zk]'") from e
    return ezkl


def ezkl_version() -> str:
    """The installed EZKL version (part of every circuit id)."""
    return str(getattr(ezkl_module(), "__version__", "unknown"))


@dataclass(frozen=True)
class ZkSettings:
    """The knobs of a step circuit; all of them enter the circuit id.

    Attributes:
        scale: fixed-point scale s (inputs, parameters and outputs all at 2**-s).
        visibility: ``"public"`` (quantised weights, batch and new weights are the public
            instances; the verifier hashes them) or ``"hashed"`` (EZKL hashed visibility: the
            instances are Poseidon digests computed in the circuit; about 2x the rows).
        num_inner_cols: EZKL columns per advice block (trades rows for columns).
        lookup_safety_margin: calibration's lookup-range head room factor.
        max_logrows: the largest circuit calibration may choose.
        bound_ulps: output bound, absolute part, in units of 2**-s.
        bound_rel: output bound, relative part, as a fraction of the largest float update.
        decomp_base, decomp_legs: EZKL's range decomposition; values entering non-linear
            ops must satisfy ``|v| < decomp_base**decomp_legs / 2`` and the range table has
            ``decomp_base`` rows (a small base lets tiny circuits use few rows).
    """

    scale: int = 12
    visibility: str = "public"
    num_inner_cols: int = 4
    lookup_safety_margin: int = 1
    max_logrows: int = 20
    bound_ulps: float = 4.0
    bound_rel: float = 0.02
    decomp_base: int = 16384
    decomp_legs: int = 2

    def __post_init__(self) -> None:
        if not 4 <= self.scale <= 20:
            raise ValueError(f"scale must be in [4, 20], got {self.scale}")
        if self.visibility not in VISIBILITIES:
            raise ValueError(f"visibility must be one of {VISIBILITIES}")
        if not 1 <= self.num_inner_cols <= 32 or not 1 <= self.lookup_safety_margin <= 64:
            raise ValueError("num_inner_cols / lookup_safety_margin out of range")
        if not 2 <= self.decomp_base <= 1 << 20 or not 1 <= self.decomp_legs <= 8:
            raise ValueError("decomp_base / decomp_legs out of range")
        if not 10 <= self.max_logrows <= 24:
            raise ValueError("max_logrows must be in [10, 24]")

    def canonical(self) -> dict[str, Any]:
        """JSON-able form, hashed into the circuit id."""
        d = asdict(self)
        d["bound_ulps"] = float(self.bound_ulps).hex()
        d["bound_rel"] = float(self.bound_rel).hex()
        d["scale_rebase_multiplier"] = 1
        return d


def write_json(path: Path, value: Any) -> None:
    """Write JSON atomically (temporary file, then rename)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(value))
    os.replace(tmp, path)


def make_settings(
    onnx_path: Path,
    data_path: Path,
    settings_path: Path,
    zs: ZkSettings,
    softmax_floor: int | None = None,
) -> dict:
    """Generate, calibrate, pin and check the EZKL settings of a step graph.

    Args:
        onnx_path: the exported step graph.
        data_path: calibration input (EZKL ``input_data`` JSON).
        settings_path: where to write the settings.
        zs: the pinned knobs.
        softmax_floor: for cross-entropy, ``-SOFTMAX_CLAMP * 2**scale``, which the lookup
            range must cover.

    Returns:
        The settings dict as written (``timestamp`` normalised to 0).

    Raises:
        CircuitError: when EZKL fails or did not keep a pinned value.
    """
    ezkl = ezkl_module()
    args = ezkl.PyRunArgs()
    args.input_visibility = zs.visibility
    args.output_visibility = zs.visibility
    args.param_visibility = "fixed"
    args.input_scale = zs.scale
    args.param_scale = zs.scale
    args.scale_rebase_multiplier = 1
    args.num_inner_cols = zs.num_inner_cols
    args.decomp_base = zs.decomp_base
    args.decomp_legs = zs.decomp_legs
    try:
        ezkl.gen_settings(str(onnx_path), str(settings_path), py_run_args=args)
        with quiet_stderr():  # calibration prints a fidelity table on stderr
            ezkl.calibrate_settings(
                str(data_path),
                str(onnx_path),
                str(settings_path),
                "resources",
                lookup_safety_margin=zs.lookup_safety_margin,
                scales=[zs.scale],
                scale_rebase_multiplier=[1],
                max_logrows=zs.max_logrows,
            )
    except Exception as e:  # EZKL raises plain RuntimeError / IOError with a message
        raise CircuitError(f"circuit: EZKL calibration failed: {e}") from e
    settings = json.loads(settings_path.read_text())
    check_pinned(settings, zs, softmax_floor)
    settings = canonical_settings(settings)
    write_json(settings_path, settings)
    return settings


def canonical_settings(settings: dict) -> dict:
    """Make settings byte-for-byte reproducible (SPEC IV §4.4).

    EZKL writes some set-valued fields (range checks, lookups, einsum equations) in hash-set
    order, which varies between runs; that order shapes the circuit layout and hence the
    verifying key, so a verifier's own build would not verify the worker's proofs. They are
    sorted here, and ``timestamp`` is set to 0.
    """
    out = dict(settings)
    for key in VOLATILE_SETTINGS:
        out[key] = 0
    for key in SET_VALUED_SETTINGS:
        if isinstance(out.get(key), list):
            out[key] = sorted(out[key], key=lambda v: json.dumps(v, sort_keys=True))
    einsum = out.get("einsum_params")
    if isinstance(einsum, dict) and isinstance(einsum.get("equations"), list):
        einsum = dict(einsum)
        einsum["equations"] = sorted(
            einsum["equations"], key=lambda v: json.dumps(v, sort_keys=True)
        )
        out["einsum_params"] = einsum
    return out


def check_pinned(settings: dict, zs: ZkSettings, softmax_floor: int | None = None) -> None:
    """Refuse settings in which calibration moved a pinned value (SPEC IV §4.2).

    Raises:
        CircuitError: on a scale, rebase multiplier or visibility other than pinned, or a
            lookup range that misses the clamped softmax input ``[softmax_floor, 0]``.
    """
    ra = settings.get("run_args", {})
    pinned = {
        "input_scale": zs.scale,
        "param_scale": zs.scale,
        "scale_rebase_multiplier": 1,
    }
    for key, want in pinned.items():
        if ra.get(key) != want:
            raise CircuitError(f"circuit: settings {key} is {ra.get(key)!r}, pinned {want}")
    scales = [*settings.get("model_input_scales", []), *settings.get("model_output_scales", [])]
    if not scales or any(s != zs.scale for s in scales):
        raise CircuitError(f"circuit: model input/output scales {scales} are not all {zs.scale}")
    lookup = ra.get("lookup_range") or [0, 0]
    if softmax_floor is not None and not lookup[0] <= softmax_floor:
        raise CircuitError(
            f"circuit: lookup range {lookup} does not cover the clamped softmax input "
            f"[{softmax_floor}, 0]"
        )
    for key in ("input_visibility", "output_visibility"):
        vis = ra.get(key)
        ok = (
            vis == "Public"
            if zs.visibility == "public"
            else (isinstance(vis, dict) and vis.get("Hashed", {}).get("hash_is_public") is True)
        )
        if not ok:
            raise CircuitError(f"circuit: settings {key} is {vis!r}, pinned {zs.visibility}")


@contextlib.contextmanager
def quiet_stderr() -> Iterator[None]:
    """Send file descriptor 2 to /dev/null for the duration (EZKL's Rust side writes there)."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "wb") as null:
            os.dup2(null.fileno(), 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def compile_circuit(onnx_path: Path, settings_path: Path, compiled_path: Path) -> None:
    """Compile the graph with the settings (EZKL ``compile_circuit``)."""
    _call(
        "compile",
        ezkl_module().compile_circuit,
        str(onnx_path),
        str(compiled_path),
        str(settings_path),
    )


def setup_keys(compiled_path: Path, srs_path: Path, vk_path: Path, pk_path: Path) -> None:
    """Generate the verifying and proving keys (written atomically)."""
    tmp_vk = vk_path.with_name(f".{vk_path.name}.{os.getpid()}.tmp")
    tmp_pk = pk_path.with_name(f".{pk_path.name}.{os.getpid()}.tmp")
    _call(
        "setup",
        ezkl_module().setup,
        str(compiled_path),
        str(tmp_vk),
        str(tmp_pk),
        srs_path=str(srs_path),
    )
    os.replace(tmp_pk, pk_path)
    os.replace(tmp_vk, vk_path)


def gen_witness(compiled_path: Path, data_path: Path, witness_path: Path) -> dict:
    """Run the compiled circuit on an input file; return the witness dict."""
    return dict(
        _call(
            "witness",
            ezkl_module().gen_witness,
            str(data_path),
            str(compiled_path),
            str(witness_path),
        )
    )


def prove(
    witness_path: Path, compiled_path: Path, pk_path: Path, srs_path: Path, proof_path: Path
) -> dict:
    """Prove one witness; return EZKL's proof JSON."""
    _call(
        "prove",
        ezkl_module().prove,
        str(witness_path),
        str(compiled_path),
        str(pk_path),
        str(proof_path),
        srs_path=str(srs_path),
    )
    return dict(json.loads(proof_path.read_text()))


def verify(proof_path: Path, settings_path: Path, vk_path: Path, srs_path: Path) -> bool:
    """Verify a proof file; False on any EZKL failure (a malformed proof is simply invalid)."""
    try:
        return bool(
            ezkl_module().verify(
                str(proof_path), str(settings_path), str(vk_path), srs_path=str(srs_path)
            )
        )
    except Exception:  # EZKL raises on malformed proofs instead of returning False
        return False


def _call(what: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
    try:
        return fn(*args, **kwargs)
    except Exception as e:
        raise CircuitError(f"circuit: EZKL {what} failed: {e}") from e
