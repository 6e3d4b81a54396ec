"""Inputs whose collective results are known in closed form (the nccl-tests `verifiable` idea).

Rank r's element i is (i + r) mod K (for prod: 2 where that is 0, else 1), K = 3 for 16-bit floats
and 7 otherwise, so every value and every partial result is a small integer that every dtype
holds exactly (integer types wrap, which is order-independent too; a byte container, hif8 or
int128, holds the integer's bytes): any algorithm must give bit-identical results, and each rank computes its expected output from a K-entry table without
seeing the other ranks' data.
"""
from __future__ import annotations

import numpy as np

from ..config.types import ReduceOp, integers_as, numpy_dtype, parse_reduce_op

_UFUNC = {ReduceOp.SUM: np.add, ReduceOp.PROD: np.multiply, ReduceOp.MAX: np.maximum, ReduceOp.MIN: np.minimum}


def modulus(dtype: str) -> int:
    return 3 if dtype in ("float16", "bfloat16") else 7


def _values(idx, rank, k, redop):
    v = (idx + rank) % k
    if redop == ReduceOp.PROD:
        v = 1 + (v == 0)
    return v


def rank_input(rank: int, count: int, dtype: str, redop="sum") -> np.ndarray:
    """Rank `rank`'s input of `count` elements."""
    redop = parse_reduce_op(redop)
    return integers_as(_values(np.arange(count, dtype=np.int64), rank, modulus(dtype), redop), dtype)


def _reduced(idx, p, dtype, redop):
    k = modulus(dtype)
    npdt = numpy_dtype(dtype)
    j = np.arange(k, dtype=np.int64)
    table = _values(j, 0, k, redop).astype(npdt)
    for r in range(1, p):
        _UFUNC[redop](table, _values(j, r, k, redop).astype(npdt), out=table)
    return table[idx % k]


def values(idx, rank: int, dtype: str, redop="sum") -> np.ndarray:
    """Rank `rank`'s input values at element indices `idx`."""
    redop = parse_reduce_op(redop)
    return integers_as(_values(np.asarray(idx, dtype=np.int64), rank, modulus(dtype), redop), dtype)


def reduced(idx, p: int, dtype: str, redop="sum") -> np.ndarray:
    """The reduction over p ranks' inputs at element indices `idx`."""
    return _reduced(np.asarray(idx, dtype=np.int64), p, dtype, parse_reduce_op(redop))
