"""A keyed random-access permutation of ``[0, N)``: any element of an epoch's shuffled order, alone.

``EpochShuffle(n, seed, epoch, stream)(positions)`` returns the sample ids at those positions
of the epoch's shuffled order, in time proportional to the positions asked for, never to N:

* up to :data:`TABLE_MAX` samples the order is an explicit uniform shuffle
  (``numpy.random.Generator.permutation``), built once per epoch (at most 8 MiB, ~15 ms);
* above it the order is a Feistel network over the smallest ``m``-bit domain that holds N,
  with cycle walking: positions that land outside ``[0, N)`` are encrypted again until they
  land inside, which keeps it a bijection of ``[0, N)``. Four rounds, each keyed by its own
  64-bit key from ``(seed, epoch, stream)``, with the SplitMix64 finaliser as round function.

Both are pure functions of ``(n, seed, epoch, stream)``, so every process, every window and
every replica sees the same order.
"""
from __future__ import annotations

import numpy as np

TABLE_MAX = 1 << 20  # at most this many samples: an explicit table (exact uniform shuffle)
_ROUNDS = 4
_CHUNK = 1 << 16  # positions encrypted together: temporaries stay in cache
_M1, _M2 = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)
_S30, _S27, _S31 = np.uint64(30), np.uint64(27), np.uint64(31)


def stream_keys(seed: int, epoch: int, stream: int, count: int) -> np.ndarray:
    """``count`` uint64 keys fixed by (seed, epoch, stream), identical in every process."""
    return np.random.SeedSequence([seed, epoch, stream]).generate_state(count, np.uint64)


def mix64(x: np.ndarray, key: np.uint64) -> np.ndarray:
    """SplitMix64's finaliser of ``x + key`` (uint64, wrapping): a keyed hash of each element."""
    z = x + key
    z ^= z >> _S30
    z *= _M1
    z ^= z >> _S27
    z *= _M2
    z ^= z >> _S31
    return z


def _generator(seed: int, epoch: int, stream: int) -> np.random.Generator:
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence([seed, epoch, stream])))


class EpochShuffle:
    """The shuffled order of ``[0, n)`` for one (seed, epoch, stream), element by element.

    Args:
        n: number of samples, at least 1.
        seed, epoch, stream: fix the order.
    """

    def __init__(self, n: int, seed: int, epoch: int, stream: int):
        self.n = int(n)
        self._table = None
        if self.n <= TABLE_MAX:
            self._table = _generator(seed, epoch, stream).permutation(self.n).astype(np.int64, copy=False)
            self._table.flags.writeable = False
            return
        m = max(2, (self.n - 1).bit_length())
        self._low = m // 2
        self._mask_hi = np.uint64((1 << (m - self._low)) - 1)
        self._mask_lo = np.uint64((1 << self._low) - 1)
        self._keys = [np.uint64(k) for k in stream_keys(seed, epoch, stream, _ROUNDS)]

    def _encrypt(self, x: np.ndarray) -> np.ndarray:
        low = np.uint64(self._low)
        hi, lo = x >> low, x & self._mask_lo
        for k, key in enumerate(self._keys):
            if k % 2 == 0:
                hi ^= mix64(lo, key) & self._mask_hi
            else:
                lo ^= mix64(hi, key) & self._mask_lo
        return (hi << low) | lo

    def __call__(self, positions: np.ndarray) -> np.ndarray:
        """Sample ids at ``positions`` (int, each in ``[0, n)``) of the shuffled order, int64."""
        positions = np.asarray(positions, dtype=np.int64)
        if self._table is not None:
            return self._table[positions]
        flat = positions.ravel()
        out = np.empty(flat.shape[0], dtype=np.int64)
        n = np.uint64(self.n)
        for lo in range(0, flat.shape[0], _CHUNK):
            x = self._encrypt(flat[lo:lo + _CHUNK].astype(np.uint64))
            walk = np.flatnonzero(x >= n)
            while walk.size:  # cycle walking: encrypt again until inside [0, n)
                y = self._encrypt(x[walk])
                x[walk] = y
                walk = walk[y >= n]
            out[lo:lo + _CHUNK] = x
        return out.reshape(positions.shape)

    def range(self, lo: int, hi: int) -> np.ndarray:
        """Sample ids at positions ``lo..hi-1``, int64 ``[hi - lo]`` (read-only for a table)."""
        if self._table is not None:
            return self._table[lo:hi]  # a read-only view
        return self(np.arange(lo, hi, dtype=np.int64))
