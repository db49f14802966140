"""A verifier's batches of one challenged interval (SPEC §8) without the epoch's whole shuffle.

Per dataset size ``n``: the Fisher–Yates loop of SPEC §5.3 (``permutation``, what training
caches once an epoch) against :class:`dk.crypto.stream.PermutationIndex` (its index, then one
interval's entries: 50 steps of 256 samples, or the epoch if smaller), the same entries (checked
here), best of three each, one thread. A verifier pays this once for each sampled interval's
epoch: about ``s`` times a verification. Its sampler takes the index where an interval's entries
are at most a quarter of ``n`` (``Sampler._span``): below, the loop is as fast (first row).
"""

from __future__ import annotations

import timeit

import numpy as np

SIZES = (1797, 50_000, 1_281_167)  # the digits samples, CIFAR-10, ImageNet-1k
REPEATS = 3


def _best(fn) -> float:  # type: ignore[no-untyped-def]
    return min(timeit.repeat(fn, number=1, repeat=REPEATS))


def main() -> None:
    from dk.crypto.hashing import u64
    from dk.crypto.stream import PermutationIndex, permutation, stream_key

    print(f"{'n':>9} {'entries':>8} {'loop ms':>9} {'index ms':>9} {'loop / index':>12}")
    for n in SIZES:
        key = stream_key("sampler", 0, u64(3))
        pos = np.arange(min(50 * 256, n)) + (n - min(50 * 256, n)) // 2
        whole = permutation(key, n)
        assert np.array_equal(PermutationIndex(key, n).at(pos), whole[pos])
        loop = _best(lambda key=key, n=n, pos=pos: permutation(key, n)[pos])
        index = _best(lambda key=key, n=n, pos=pos: PermutationIndex(key, n).at(pos))
        print(f"{n:>9} {pos.size:>8} {loop * 1e3:>9.1f} {index * 1e3:>9.1f} {loop / index:>11.1f}x")


if __name__ == "__main__":
    main()
