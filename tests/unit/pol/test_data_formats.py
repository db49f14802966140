"""Dataset formats (SPEC §7.2-§7.5): shards, token files, image folders, map-style objects.

Each format: a pinned root on a tiny generated dataset, laziness (memory-mapped, nothing big
read on open), and one-line ``FormatError`` refusals of bad input.
"""

from __future__ import annotations

import os
import struct
from pathlib import Path

import numpy as np
import pytest

from dk.crypto.canonical_json import canonical_json
from dk.crypto.merkle import leaf_hash, merkle_root
from dk.errors import FormatError
from dk.pol.data import (
    Dataset,
    ImageDataset,
    as_dataset,
    data_root,
    load_shards,
    load_tokens,
    write_shards,
)
from dk.pol.data.images import installed_decoder
from dk.pol.data.synth import digits_image_folder, png_bytes, stdlib_text, token_file

X = (np.arange(30, dtype=np.float32).reshape(10, 3) / np.float32(4)).astype(np.float32)
Y = (np.arange(10) % 3).astype(np.int64)
ARRAYS_ROOT = "2b10c1f28f73cc973262588ef38dc78529018bb6c897fc75824d22a91a93e28b"


@pytest.fixture(autouse=True)
def _one_thread(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("DK_DATA_THREADS", "1")
    monkeypatch.setenv("DK_CACHE_DIR", str(tmp_path / "cache"))


def _one_line(e: pytest.ExceptionInfo[FormatError]) -> None:
    assert "\n" not in str(e.value) and str(e.value)


# -- shards --------------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", ["npy", "safetensors"])
def test_shards_have_the_arrays_root_and_are_memory_mapped(fmt: str, tmp_path: Path) -> None:
    write_shards(Dataset(X, Y), tmp_path / "s", shard_size=4, fmt=fmt)
    ds = load_shards(tmp_path / "s")
    assert len(ds) == 10 and ds.sample_shape == (3,) and ds.output_dim == 3
    assert all(isinstance(p, np.memmap) for p in ds.X.parts) and len(ds.X.parts) == 3
    assert ds.root().hex() == data_root(X, Y).hex() == ARRAYS_ROOT
    idx = np.array([9, 0, 4, 5])
    np.testing.assert_array_equal(ds.X[idx], X[idx])
    np.testing.assert_array_equal(ds.y[idx], Y[idx])
    np.testing.assert_array_equal(ds.X[2:7], X[2:7])
    assert ds.sample_bytes(7) == X[7].tobytes() + Y[7].tobytes()


def test_arrays_root_is_pinned_and_follows_the_stream() -> None:
    meta = canonical_json(
        {
            "format": "arrays",
            "x": {"dtype": "float32", "shape": [10, 3]},
            "y": {"dtype": "int64", "shape": [10]},
        }
    )
    stream = b"DKD1" + struct.pack("<I", len(meta)) + meta + X.tobytes() + Y.tobytes()
    assert merkle_root([leaf_hash(stream)]).hex() == ARRAYS_ROOT == data_root(X, Y).hex()
    ds = Dataset(X, Y)
    for i in (0, 9):
        (xo, xl), (yo, yl) = ds.sample_offsets(i)
        body = stream[len(stream) - 10 * 3 * 4 - 10 * 8 :]
        assert body[xo : xo + xl] + body[yo : yo + yl] == ds.sample_bytes(i)


def test_many_chunks_straddle_arrays() -> None:
    """A stream over several 64 KiB chunks, with X/y and chunk boundaries not aligned."""
    rng = np.random.default_rng(1)
    Xb = rng.standard_normal((5000, 7)).astype(np.float32)
    yb = rng.integers(0, 5, 5000).astype(np.int64)
    ds = Dataset(Xb, yb)
    from dk.pol.data.stream import stream_prefix

    stream = stream_prefix(ds.layout()) + Xb.tobytes() + yb.tobytes()
    chunks = [stream[i : i + 65536] for i in range(0, len(stream), 65536)]
    assert len(chunks) == 3
    assert ds.root() == merkle_root([leaf_hash(c) for c in chunks])
    assert data_root(Xb, yb, threads=3) == ds.root()  # threads do not change the root


def test_shard_refusals(tmp_path: Path) -> None:
    d = tmp_path / "s"
    write_shards(Dataset(X, Y), d, shard_size=5)
    (d / "notes.txt").write_text("hi")
    with pytest.raises(FormatError, match="only") as e:
        load_shards(d)
    _one_line(e)
    (d / "notes.txt").unlink()
    np.save(d / "000001.X.npy", X[5:].astype(np.float64))
    with pytest.raises(FormatError, match="float32") as e:
        load_shards(d)
    np.save(d / "000001.X.npy", X[5:, :2])
    with pytest.raises(FormatError, match="shape differs"):
        load_shards(d)
    np.save(d / "000001.X.npy", X[5:])
    np.save(d / "000001.y.npy", -Y[5:] - 1)
    with pytest.raises(FormatError, match="non-negative"):
        load_shards(d)
    np.save(d / "000001.y.npy", Y[5:])
    Xn = X[5:].copy()
    Xn[1, 1] = np.nan
    np.save(d / "000001.X.npy", Xn)
    ds = load_shards(d)  # lazy: NaN is refused when a batch holding it is read
    ds.X[[0, 1, 9]]
    with pytest.raises(FormatError, match="non-finite"):
        ds.X[[0, 6]]
    (d / "000001.X.npy").unlink()
    with pytest.raises(FormatError, match="pairs"):
        load_shards(d)
    with pytest.raises(FormatError, match="not found") as e:
        load_shards(tmp_path / "missing")
    assert e.value.reason == "DATA_MISMATCH"


def test_safetensors_shard_header_is_strict(tmp_path: Path) -> None:
    d = tmp_path / "s"
    write_shards(Dataset(X, Y), d, shard_size=10, fmt="safetensors")
    f = d / "000000.safetensors"
    good = f.read_bytes()
    f.write_bytes(struct.pack("<Q", 1 << 40) + good[8:])
    with pytest.raises(FormatError, match="header length"):
        load_shards(d)
    f.write_bytes(good[:-8])  # truncated data
    with pytest.raises(FormatError, match="outside the file"):
        load_shards(d)
    from safetensors.numpy import save_file

    save_file({"X": X, "y": Y, "z": Y}, str(f))
    with pytest.raises(FormatError, match="exactly tensors X and y"):
        load_shards(d)
    save_file({"X": X.astype(np.float64), "y": Y}, str(f))
    with pytest.raises(FormatError, match="dtype"):
        load_shards(d)


# -- token files ----------------------------------------------------------------------------

TOKENS = (np.arange(23, dtype=np.uint16) * 1000 + 7).astype("<u2")
TOKENS_ROOT = "de77fe77d584a0be1080f408b1fa61588edbcfae0da3c7e6a06e2d0ea667907e"


def test_token_windows_and_pinned_root(tmp_path: Path) -> None:
    p = tmp_path / "t.bin"
    p.write_bytes(TOKENS.tobytes())
    ds = load_tokens(p, dtype="uint16", seq_len=5)
    assert isinstance(ds.tokens, np.memmap)
    assert len(ds) == 4 and ds.sample_shape == (5,)  # (23 - 1) // 5
    np.testing.assert_array_equal(ds.X[1], TOKENS[5:10])
    np.testing.assert_array_equal(ds.y[1], TOKENS[6:11])
    x, y = ds.batch([3, 0])
    assert x.dtype == y.dtype == np.int64 and x.shape == (2, 5)
    np.testing.assert_array_equal(x[0], TOKENS[15:20])
    np.testing.assert_array_equal(y[0], TOKENS[16:21])
    assert ds.sample_bytes(3) == TOKENS[15:21].tobytes()
    assert ds.sample_offsets(3) == [(30, 12)]
    assert ds.output_dim == 22 * 1000 + 7 + 1
    meta = canonical_json({"count": 23, "dtype": "uint16", "format": "tokens"})
    stream = b"DKD1" + struct.pack("<I", len(meta)) + meta + TOKENS.tobytes()
    assert ds.root() == merkle_root([leaf_hash(stream)])
    assert ds.root().hex() == TOKENS_ROOT
    p32 = tmp_path / "t32.bin"
    p32.write_bytes(TOKENS.tobytes()[:44])  # the same bytes read as 11 uint32 tokens
    assert (
        load_tokens(p32, dtype="uint32", seq_len=5).root()
        != load_tokens(p32.with_name("t.bin"), dtype="uint16", seq_len=5).root()
    )


def test_token_file_is_not_read_on_open(tmp_path: Path) -> None:
    """A 4 GiB sparse file opens instantly and reads only the windows asked for."""
    p = tmp_path / "big.bin"
    with open(p, "wb") as f:
        f.truncate(4 * 1024**3)
        f.seek(2 * 1024**3)
        f.write(np.arange(300, dtype="<u2").tobytes())
    ds = load_tokens(p, dtype="uint16", seq_len=256)
    assert len(ds) == (2 * 1024**3 - 1) // 256
    i = 1024**3 // 256  # the window starting at token 2^30 = byte 2 GiB
    np.testing.assert_array_equal(ds.X[i], np.arange(256))
    assert (os.stat(p).st_blocks * 512) < 64 * 1024**2  # still sparse: nothing was written


@pytest.mark.parametrize(
    "nbytes, dtype, seq_len, match",
    [
        (45, "uint16", 4, "whole number of uint16"),
        (46, "uint32", 4, "whole number of uint32"),
        (46, "uint16", 23, "too short for one window"),
        (0, "uint16", 1, "too short"),
        (46, "int8", 4, "uint16 or uint32"),
    ],
)
def test_token_file_refusals(
    nbytes: int, dtype: str, seq_len: int, match: str, tmp_path: Path
) -> None:
    p = tmp_path / "t.bin"
    p.write_bytes(TOKENS.tobytes()[:nbytes])
    with pytest.raises(FormatError, match=match) as e:
        load_tokens(p, dtype=dtype, seq_len=seq_len)
    _one_line(e)


def test_token_file_from_python_text(tmp_path: Path) -> None:
    text = stdlib_text()
    assert "Beautiful is better than ugly." in text and len(text) > 50_000
    p = token_file(tmp_path / "t.bin")
    ds = load_tokens(p, dtype="uint16", seq_len=64)
    assert bytes(ds.X[0].astype(np.uint8)).startswith(b"The Zen of Python")
    assert ds.output_dim <= 256


# -- image folders ---------------------------------------------------------------------------

IMAGES_ROOT = "d6ffa73c6cdaca84eb23a7b4e3f692ee189f26f8c7a9934932d69a3d7c0b4ea7"


def _folder(tmp_path: Path) -> Path:
    g = np.arange(16, dtype=np.uint8).reshape(4, 4) * 16
    root = tmp_path / "img"
    for rel, img in (
        ("cat/a.png", np.stack([g, g, g], -1)),
        ("cat/b.png", np.stack([g.T, g, 255 - g], -1)),
        ("dog/c.png", np.stack([255 - g, g.T, g], -1)),
    ):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(png_bytes(img))
    return root


def test_image_folder_decodes_and_commits_file_bytes(tmp_path: Path) -> None:
    root = _folder(tmp_path)
    ds = ImageDataset(root, decoder=installed_decoder())
    assert len(ds) == 3 and ds.sample_shape == (3, 4, 4) and ds.output_dim == 2
    np.testing.assert_array_equal(ds.y[:], [0, 0, 1])
    x = ds.X[[2]]
    g = np.arange(16, dtype=np.float32).reshape(4, 4) * 16
    np.testing.assert_array_equal(x[0, 0], (255 - g) / np.float32(255))
    np.testing.assert_array_equal(x[0, 1], g.T / np.float32(255))
    files = [(root / r).read_bytes() for r in ("cat/a.png", "cat/b.png", "dog/c.png")]
    meta = canonical_json(
        {
            "classes": ["cat", "dog"],
            "files": [
                [0, "cat/a.png", len(files[0])],
                [0, "cat/b.png", len(files[1])],
                [1, "dog/c.png", len(files[2])],
            ],
            "format": "images",
        }
    )
    stream = b"DKD1" + struct.pack("<I", len(meta)) + meta + b"".join(files)
    assert ds.root() == merkle_root([leaf_hash(stream)])
    assert ds.root().hex() == IMAGES_ROOT
    assert ds.sample_bytes(1) == files[1]
    grey = ImageDataset(root, decoder=installed_decoder(), mode="L")
    assert grey.sample_shape == (1, 4, 4) and grey.root() == ds.root()


def test_image_decoder_mismatch_is_its_own_reason(tmp_path: Path) -> None:
    with pytest.raises(FormatError, match="this machine has") as e:
        ImageDataset(_folder(tmp_path), decoder="pillow==0.0.1")
    assert e.value.reason == "DECODER_MISMATCH"
    _one_line(e)


def test_image_refusals(tmp_path: Path) -> None:
    root = _folder(tmp_path)
    (root / "dog" / "c.png").write_bytes(b"\x89PNG\r\n\x1a\n garbage")
    ds = ImageDataset(root, decoder=installed_decoder())  # lazy: the first image decodes
    with pytest.raises(FormatError, match="cannot decode image") as e:
        ds.X[[0, 2]]
    _one_line(e)
    g = np.zeros((8, 8), np.uint8)
    (root / "dog" / "c.png").write_bytes(png_bytes(g))
    with pytest.raises(FormatError, match="decodes to"):
        ImageDataset(root, decoder=installed_decoder()).X[2]
    (root / "dog" / "c.png").write_bytes(b"GIF89a")
    (root / "dog" / "c.png").rename(root / "dog" / "c.gif")
    with pytest.raises(FormatError, match=r"only \.png"):
        ImageDataset(root, decoder=installed_decoder())
    (root / "dog" / "c.gif").unlink()
    (root / "stray.png").write_bytes(png_bytes(g))
    with pytest.raises(FormatError, match="only class sub-folders"):
        ImageDataset(root, decoder=installed_decoder())
    with pytest.raises(FormatError, match="not found"):
        ImageDataset(tmp_path / "nope", decoder=installed_decoder())


def test_digits_image_folder_is_cifar_shaped(tmp_path: Path) -> None:
    root = digits_image_folder(tmp_path / "img", n=30)
    ds = ImageDataset(root, decoder=installed_decoder())
    assert len(ds) == 30 and ds.sample_shape == (3, 32, 32)
    x = ds.X[np.arange(30)]
    assert x.dtype == np.float32 and 0.0 <= x.min() and x.max() <= 1.0 and x.max() > 0.5
    again = digits_image_folder(tmp_path / "img2", n=30)
    assert ImageDataset(again, decoder=installed_decoder()).root() == ds.root()


# -- map-style ------------------------------------------------------------------------------


def test_map_style_dataset_has_the_arrays_root(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    tds = torch.utils.data.TensorDataset(torch.from_numpy(X), torch.from_numpy(Y))
    ds = as_dataset(tds)
    assert len(ds) == 10 and ds.is_classification and ds.output_dim == 3
    np.testing.assert_array_equal(ds.X[[3, 1]], X[[3, 1]])
    assert ds.root().hex() == ARRAYS_ROOT
    lst = as_dataset([(list(map(float, X[i])), float(i)) for i in range(10)])
    assert not lst.is_classification and lst.y[[2]].tolist() == [[2.0]]
    write_shards(tds, tmp_path / "s", shard_size=3)
    assert load_shards(tmp_path / "s").root().hex() == ARRAYS_ROOT
    assert as_dataset(ds) is ds


@pytest.mark.parametrize(
    "items, match",
    [
        ([(np.zeros(3, np.float32), 1), (np.zeros(4, np.float32), 1)], "shape"),
        ([(np.zeros(3, np.float32), 1), (np.zeros(3, np.float32), -1)], "label"),
        ([(np.zeros(3, np.float32), 1), (np.full(3, np.inf, np.float32), 1)], "non-finite"),
        ([(np.zeros(3, np.int64), 1)], "float array"),
        ([np.zeros(3)], "pair"),
        ([], "between 1"),
    ],
)
def test_map_style_refusals(items: list[object], match: str) -> None:
    with pytest.raises(FormatError, match=match) as e:
        as_dataset(items).root()
    _one_line(e)
    with pytest.raises(FormatError, match="not a dataset"):
        as_dataset(3)


def test_threaded_hashing_gives_the_same_root(monkeypatch: pytest.MonkeyPatch) -> None:
    """The parallel path runs (several threads hash chunk runs) and changes nothing."""
    import threading

    from dk.pol.data import stream

    seen: set[int] = set()
    real = stream._hash_leaves
    # In the threaded pass the first two calls wait for each other: they meet only if two
    # pool threads hash at once (a serial pool breaks the barrier; a fast thread that finished
    # its part first could otherwise be handed every part, and the test would flake).
    meet = threading.Barrier(2, timeout=30)
    main = threading.get_ident()

    def spy(chunks: list[bytes | memoryview]) -> list[bytes]:
        me = threading.get_ident()
        if me != main and len(seen - {main}) < 2:
            seen.add(me)
            meet.wait()
        seen.add(me)
        return real(chunks)

    monkeypatch.setattr(stream, "_hash_leaves", spy)
    rng = np.random.default_rng(2)
    Xb = rng.standard_normal((20_000, 16)).astype(np.float32)  # 1.28 MB: 20 chunks
    yb = rng.integers(0, 3, 20_000).astype(np.int64)
    one = data_root(Xb, yb, threads=1)
    assert seen == {threading.get_ident()}
    seen.clear()
    assert data_root(Xb, yb, threads=4) == one
    assert len(seen) >= 2 and threading.get_ident() not in seen
