"""``dk export``: the final weights of a run or bundle as a safetensors file.

The last committed checkpoint is read strictly (bounded, never unpickled), its root is
recomputed and compared with the one the run or manifest lists, and its ``model/*`` tensors
(parameters and buffers) are written under their state-dict names, ready for
``model.load_state_dict(safetensors.torch.load_file(path))``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dk.crypto.hashing import digests_equal
from dk.errors import FormatError
from dk.pol.checkpoint import (
    blob_name,
    checkpoint_root,
    model_tensors,
    parse_blob,
    read_blob_file,
)


def _last_root(source: Path) -> tuple[int, bytes, int | None]:
    """(step, root, nbytes) of the last checkpoint of a run directory or a bundle (``nbytes``
    ``None`` for a bundle: its file is read with the blob size bound)."""
    if (source / "manifest.json").is_file():
        from dk.pol.transcript import MAX_MANIFEST_BYTES, parse_manifest

        with open(source / "manifest.json", "rb") as f:
            m = parse_manifest(f.read(MAX_MANIFEST_BYTES + 1)).raw
        last = m["checkpoints"][-1]
        return int(last["step"]), bytes.fromhex(last["root"]), None
    from dk.pol.run import read_run

    info = read_run(source)
    if not info.complete or not info.checkpoints:
        raise FormatError(f"run {source} is incomplete: nothing final to export")
    last = info.checkpoints[-1]
    return last.step, bytes.fromhex(last.root), last.nbytes


def export_weights(source: str | Path, out: str | Path) -> dict[str, Any]:
    """Write the final ``model/*`` tensors of ``source`` (run or bundle) to ``out``.

    Returns:
        ``{"step", "root", "tensors", "out"}`` of what was written.

    Raises:
        FormatError: no run or bundle, an incomplete run, or a blob that is not its root's.
    """
    from safetensors.numpy import save_file

    src = Path(source)
    step, root, nbytes = _last_root(src)
    if nbytes is not None:  # a run directory: packed or a file (SPEC §11.8), checked
        from dk.pol.pack import RunBlobs

        tensors = RunBlobs(src).checkpoint(root, nbytes)
    else:
        tensors = parse_blob(read_blob_file(src / blob_name(root)))
    if not digests_equal(checkpoint_root(tensors), root):
        raise FormatError(
            f"{blob_name(root)} does not hash to its committed root", reason="COMMITMENT_MISMATCH"
        )
    weights = {k: v.reshape(v.shape) for k, v in model_tensors(tensors).items()}
    save_file(weights, str(out))
    return {"step": step, "root": root.hex(), "tensors": len(weights), "out": str(out)}
