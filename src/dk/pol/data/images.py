"""Image folders (SPEC §7.4): class sub-folders of PNG/JPEG files, decoded on demand.

The commitment covers the files' bytes, not decoded pixels, so it does not depend on the
decoder; the decoder (library and exact version) is named in the job instead, and a machine
whose decoder differs refuses with reason ``DECODER_MISMATCH`` (an inconclusive outcome for a
verifier: its own tools fall short, the worker is not at fault). Pixels become float32
``(C, H, W)`` values ``p / 255``; every image of a dataset must decode to one size.
"""

from __future__ import annotations

import io
import os
import stat
from pathlib import Path
from typing import Any

import numpy as np

from dk.errors import FormatError
from dk.pol.data.base import MAX_SAMPLES, Dataset

EXTENSIONS = (".png", ".jpg", ".jpeg")
MODES = ("RGB", "L")
MAX_IMAGE_BYTES = 64 * 1024 * 1024
MAX_PIXELS = 4096 * 4096


def installed_decoder() -> str:
    """The decoder this machine has, as a job names it: ``pillow==<version>``."""
    try:
        import PIL
    except ImportError:
        return "none"
    return f"pillow=={PIL.__version__}"


def _utf8_sorted(names: list[str]) -> list[str]:
    return sorted(names, key=lambda s: s.encode("utf-8"))


def scan_folder(root: Path) -> tuple[list[str], list[tuple[int, str, int]]]:
    """Classes (sorted sub-folder names) and files ``(label, "class/name", size)`` (SPEC §7.4)."""
    if not root.is_dir():
        raise FormatError(f"image folder not found: {root}", reason="DATA_MISMATCH")
    classes = _utf8_sorted(os.listdir(root))
    files: list[tuple[int, str, int]] = []
    for label, cls in enumerate(classes):
        cdir = root / cls
        if not stat.S_ISDIR(os.lstat(cdir).st_mode):
            raise FormatError(f"{cdir}: an image folder holds only class sub-folders")
        for name in _utf8_sorted(os.listdir(cdir)):
            p = cdir / name
            st = os.lstat(p)
            if not stat.S_ISREG(st.st_mode) or not name.lower().endswith(EXTENSIONS):
                raise FormatError(f"{p}: class folders hold only .png/.jpg/.jpeg files")
            if st.st_size > MAX_IMAGE_BYTES:
                raise FormatError(f"{p}: over {MAX_IMAGE_BYTES} bytes")
            files.append((label, f"{cls}/{name}", int(st.st_size)))
            if len(files) > MAX_SAMPLES:
                raise FormatError(f"{root}: more than {MAX_SAMPLES} images")
    if not files:
        raise FormatError(f"{root}: no images")
    return classes, files


def decode_image(data: bytes, mode: str, where: str) -> np.ndarray:
    """Decode PNG/JPEG bytes to float32 ``(C, H, W)`` in [0, 1] (one-line errors)."""
    from PIL import Image

    try:
        with Image.open(io.BytesIO(data), formats=["PNG", "JPEG"]) as im:
            if im.width * im.height > MAX_PIXELS:
                raise FormatError(f"{where}: {im.width}x{im.height} is over {MAX_PIXELS} pixels")
            a = np.asarray(im.convert(mode), dtype=np.uint8)
    except FormatError:
        raise
    except Exception as e:  # PIL raises OSError, SyntaxError, ValueError, its own errors
        msg = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise FormatError(f"{where}: cannot decode image: {msg}") from None
    a = a[:, :, None] if a.ndim == 2 else a
    return np.ascontiguousarray(a.transpose(2, 0, 1)).astype(np.float32) / np.float32(255)


class Decoded:
    """Column ``X`` of an image folder: decodes the images asked for."""

    def __init__(self, ds: ImageDataset, shape: tuple[int, ...]) -> None:
        self.ds = ds
        self.dtype = np.dtype(np.float32)
        self.shape = (len(ds.files_list), *shape)
        self.ndim = len(self.shape)

    def __len__(self) -> int:
        return self.shape[0]

    def row(self, i: int) -> np.ndarray:
        x = decode_image(self.ds.read(i), self.ds.mode, self.ds.path_of(i))
        if x.shape != self.shape[1:]:
            raise FormatError(
                f"{self.ds.path_of(i)}: decodes to {x.shape}, the folder's images are "
                f"{self.shape[1:]}"
            )
        return x

    def __getitem__(self, key: Any) -> np.ndarray:
        if isinstance(key, slice):
            key = np.arange(*key.indices(self.shape[0]))
        idx = np.asarray(key, dtype=np.int64)
        rows = [self.row(int(i)) for i in idx.reshape(-1)]
        out = np.stack(rows) if rows else np.empty((0, *self.shape[1:]), np.float32)
        return out.reshape(*idx.shape, *self.shape[1:])


class ImageDataset(Dataset):
    """An image folder as samples (decoded pixels, class index) (SPEC §7.4)."""

    kind = "images"

    def __init__(self, root: Path, *, decoder: str, mode: str = "RGB") -> None:
        have = installed_decoder()
        if decoder != have:
            raise FormatError(
                f"the job decodes images with {decoder}, this machine has {have}",
                reason="DECODER_MISMATCH",
            )
        if mode not in MODES:
            raise FormatError(f"image mode must be one of {', '.join(MODES)}, not {mode!r}")
        self.folder, self.decoder, self.mode = Path(root), decoder, mode
        self.classes, self.files_list = scan_folder(self.folder)
        self.offsets = np.cumsum([0] + [f[2] for f in self.files_list])
        y = np.array([f[0] for f in self.files_list], dtype=np.int64)
        shape = decode_image(self.read(0), mode, self.path_of(0)).shape
        super().__init__(
            Decoded(self, shape), y, files=[self.folder / f[1] for f in self.files_list]
        )

    @property
    def output_dim(self) -> int:
        """The number of classes (sub-folders)."""
        return len(self.classes)

    def path_of(self, i: int) -> str:
        """The file of sample ``i``."""
        return str(self.folder / self.files_list[i][1])

    def read(self, i: int) -> bytes:
        """The committed bytes of image ``i`` (its file, whose size must not have changed)."""
        _, rel, size = self.files_list[i]
        with open(self.folder / rel, "rb") as f:
            data = f.read(size + 1)
        if len(data) != size:
            raise FormatError(f"{self.path_of(i)}: changed size since the folder was scanned")
        return data

    def layout(self) -> dict[str, Any]:
        """``{"format": "images", "classes": [...], "files": [[label, path, size], ...]}``."""
        return {
            "classes": list(self.classes),
            "files": [list(f) for f in self.files_list],
            "format": "images",
        }

    def payload(self) -> Any:
        """Every file's bytes, in the order of ``files``."""
        return (self.read(i) for i in range(len(self.files_list)))

    def sample_bytes(self, i: int) -> bytes:
        """Image ``i``'s file bytes (SPEC §7.4)."""
        return self.read(self._index(i))

    def sample_offsets(self, i: int) -> list[tuple[int, int]]:
        """One byte run: the file's bytes in the payload."""
        i = self._index(i)
        return [(int(self.offsets[i]), int(self.files_list[i][2]))]

    def cache_tag(self) -> str:
        """The layout lists the folder's relative paths."""
        return f"images/{self.folder.resolve()}"
