"""Datasets made from what ships with Python and scikit-learn (no download), for tests and
examples: a CIFAR-shaped image folder from the digits, and a token file from Python's text.

PNG files are written by hand with *stored* (uncompressed) deflate blocks, so their bytes, and
the folder's data root, are the same on every machine and every zlib.
"""

from __future__ import annotations

import ast
import codecs
import importlib.util
import struct
import zlib
from pathlib import Path

import numpy as np

STDLIB_MODULES = ("textwrap", "string", "difflib", "heapq", "bisect", "fnmatch", "shlex")


def png_bytes(img: np.ndarray) -> bytes:
    """A PNG of a uint8 ``(H, W)`` (grey) or ``(H, W, 3)`` (RGB) image, byte-for-byte stable."""
    a = np.ascontiguousarray(img, dtype=np.uint8)
    h, w = a.shape[:2]
    colour = 0 if a.ndim == 2 else 2
    raw = b"".join(b"\x00" + a[r].tobytes() for r in range(h))  # filter type 0 per row
    blocks = [raw[i : i + 65535] for i in range(0, len(raw), 65535)] or [b""]
    body = b"".join(
        bytes([int(k == len(blocks) - 1)]) + struct.pack("<HH", len(b), 0xFFFF ^ len(b)) + b
        for k, b in enumerate(blocks)
    )
    z = b"\x78\x01" + body + struct.pack(">I", zlib.adler32(raw))

    def chunk(tag: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", zlib.crc32(tag + data))

    ihdr = struct.pack(">IIBBBBB", w, h, 8, colour, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", z) + chunk(b"IEND", b"")


def digits_image_folder(root: Path, *, n: int | None = None, size: int = 32) -> Path:
    """Write scikit-learn's digits as a CIFAR-shaped folder: ``root/<label>/<index>.png``.

    Each 8×8 digit is scaled to ``size``×``size`` (nearest neighbour), its 0–16 intensities
    to 0–255, and given three channels tinted by position so that colour carries signal.
    """
    from sklearn.datasets import load_digits

    d = load_digits()
    count = len(d.target) if n is None else min(n, len(d.target))
    f = size // 8
    root = Path(root)
    for i in range(count):
        g = np.kron(d.images[i], np.ones((f, f))) * (255.0 / 16.0)
        ramp = np.linspace(0.6, 1.0, g.shape[1])[None, :]
        rgb = np.stack([g, g * ramp, g * ramp[:, ::-1]], axis=-1)
        img = np.clip(np.rint(rgb), 0, 255).astype(np.uint8)
        out = root / str(int(d.target[i])) / f"{i:05d}.png"
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_bytes(png_bytes(img))
    return root


def _zen() -> str:
    """The Zen of Python, read from ``this.py`` without importing it (that prints it)."""
    spec = importlib.util.find_spec("this")
    if spec is None or not spec.origin:  # pragma: no cover - always in CPython
        return ""
    tree = ast.parse(Path(spec.origin).read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "s":
            return codecs.decode(ast.literal_eval(node.value), "rot13")
    return ""  # pragma: no cover


def stdlib_text(max_bytes: int | None = None) -> str:
    """The Zen of Python and the source of a few pure-Python standard-library modules."""
    parts = [_zen()]
    for name in STDLIB_MODULES:
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.origin and spec.origin.endswith(".py"):
            parts.append(Path(spec.origin).read_text(encoding="utf-8"))
    text = "\n".join(parts)
    return text if max_bytes is None else text.encode("utf-8")[:max_bytes].decode("utf-8", "ignore")


def token_file(path: Path, *, text: str | None = None, dtype: str = "uint16") -> Path:
    """Write ``text`` (default :func:`stdlib_text`) as byte-level tokens (ids 0–255)."""
    data = (stdlib_text() if text is None else text).encode("utf-8")
    tokens = np.frombuffer(data, dtype=np.uint8).astype({"uint16": "<u2", "uint32": "<u4"}[dtype])
    Path(path).write_bytes(tokens.tobytes())
    return Path(path)
