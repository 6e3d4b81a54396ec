"""hccl_test's check rule: each binary's inputs, expected outputs, comparison and overflow limits.

Read in hicann/oam-tools at ea0ce91 (docs/references.md §11.5), `src/hccl_test/`:
- inputs are constants (`common/src/hccl_check_buf_init.cc`, `hccl_host_buf_init`): val = 2 for
  AllReduce, Reduce and Broadcast; rank + 1 for AllGather(V), AlltoAllV(C); block i of every rank
  = i + 1 for ReduceScatter(V) (but 2 everywhere for prod or int8) and for Scatter's root; AlltoAll
  sends the byte pattern 5a5a5a5a a5a5a5a5 (`opbase_test/hccl_alltoall_rootinfo_test.cc`);
- expected values come from `hccl_reduce_check_buf_init` (sum val·p, prod pow(val, p), max/min
  val, in each type's C conversions) or from the inputs themselves;
- comparison (`common/src/hccl_check_common.cc`): fp32 within a relative 1e-4 (absolute 1e-6, or
  1e-3 at zero); every other type bit for bit; AlltoAll per received block, AlltoAllV(C) per
  source rank; a type an op's switch lacks is "no match datatype", a failure;
- no check (check_result NULL) past the rank counts `is_data_overflow` / `is_initdata_overflow`
  give (`common/src/hccl_opbase_rootinfo_base.{h,cc}`, each op's override).

Values follow the C code as compiled for hccl_test's hosts (a double or float outside an int's
range converts to INT_MIN, as cvttsd2si does): the bf16 helper `fp32tobf16` returns its rounded float converted to uint16,
so hccl_test's bf16 "2" is the bit pattern 0x0002, a subnormal. Nothing here imports bench.
"""
from __future__ import annotations

import math

import numpy as np

from ..config.types import numpy_dtype

BYTE_TYPES = ("int8", "uint8", "hif8", "float8_e4m3fn", "float8_e5m2", "float8_e8m0fnu")
"""Types hccl_test fills with `host_buf_init_int8`: the byte val % 128."""
REDUCING = ("allreduce", "reduce", "reducescatter", "reducescatterv")
BYTE_OVERFLOW_OPS = ("allgather", "allgatherv", "alltoall", "alltoallv", "alltoallvc", "scatter")
"""Ops calling `is_initdata_overflow` (Broadcast calls no overflow check at all)."""

_FULL = ("float32", "int8", "uint8", "int32", "float16", "int16", "bfloat16", "int64", "uint64", "float64")
_MOVED = ("float32", "int32", "uint32", "float16", "int16", "uint16", "bfloat16", "int64", "float64",
          "uint64") + BYTE_TYPES
CHECKED = {"allreduce": _FULL, "reduce": _FULL, "reducescatter": _FULL,
           "reducescatterv": _FULL[:8],                      # its switch has no uint64, fp64 case
           "allgather": _MOVED, "allgatherv": _MOVED, "broadcast": _MOVED, "scatter": _MOVED}
"""Each binary's check_buf_result switch; the AlltoAll family checks every held type."""

PROD_LIMITS = {"float16": 16, "float32": 128, "int8": 7, "int32": 31, "int64": 63}
"""RANKSIZE_TH_*: prod is unchecked from this rank count on (hccl_opbase_rootinfo_base.h)."""
PRECISION = {"int8": 7, "int16": 15, "int32": 31, "int64": 63, "float16": 10, "float32": 23, "bfloat16": 7}
"""HcclDataTypePrecision (hccl_opbase_rootinfo_base.h): the bits the sum limits are made of."""
SUM_TYPES = {"allreduce": ("int8", "int16", "float16", "bfloat16"),
             "reduce": ("int8", "int16", "float16", "bfloat16"),
             "reducescatter": ("int8", "int16", "int32", "float16", "bfloat16", "float32"),
             "reducescatterv": ("int8", "int16", "int32", "float16", "bfloat16", "float32")}
OVERFLOW = "Warning: The calculation result overflows, No verification is performed."
INITDATA_OVERFLOW = "Warning: The initdata overflows, No verification is performed."
PATTERN = np.array([0x5a, 0x5a, 0x5a, 0x5a, 0xa5, 0xa5, 0xa5, 0xa5], dtype=np.uint8)


def sum_limit(op: str, dtype: str) -> int:
    """Most ranks a sum is checked on: (2^precision - 1) / 2 for AllReduce and Reduce
    (ALLREDUCE_SUM_MAX_RANKSIZE), int64_t(sqrt(2^precision - 1)) for ReduceScatter(V)."""
    top = (1 << PRECISION[dtype]) - 1
    return top // 2 if op in ("allreduce", "reduce") else int(math.sqrt(top))


def unchecked(op: str, dtype: str, redop: str, p: int) -> str | None:
    """hccl_test's warning when it checks nothing for this op, type, reduce op and rank count
    (its check_result is then NULL), else None."""
    if op in REDUCING:
        if redop == "prod" and dtype in PROD_LIMITS and p >= PROD_LIMITS[dtype]:
            return OVERFLOW
        if redop == "sum" and dtype in SUM_TYPES[op] and p > sum_limit(op, dtype):
            return OVERFLOW
    elif op in BYTE_OVERFLOW_OPS and dtype in BYTE_TYPES and p >= 128:
        return INITDATA_OVERFLOW
    return None


def c_int(x: float, bits: int = 32) -> int:
    """A C conversion of a double to a signed integer of `bits` by cvttsd2si: truncation, and the
    'integer indefinite' (the most negative value) outside the range."""
    lo = -(1 << (bits - 1))
    if not math.isfinite(x) or not lo <= x < -lo:
        return lo
    return int(x)


def _wrap(value: int, dtype: np.dtype) -> np.ndarray:
    """An integer stored into a C integer type of dtype's width (two's complement)."""
    bits = dtype.itemsize * 8
    return np.array([value & ((1 << bits) - 1)], dtype=f"u{dtype.itemsize}").view(dtype)


def bf16_bits(x: float) -> int:
    """hccl_test's fp32tobf16(x): x rounded half up to bf16 precision, then that float converted to
    uint16 (a value, not its bits; out of range gives 0, cvttss2si's INT_MIN truncated)."""
    f = np.float32(x)
    bits = int(f.view(np.uint32))
    exp, man = bits & 0x7F800000, bits & 0x007FFFFF
    if (exp == 0 and man == 0) or exp == 0x7F800000:
        y = float(f)
    else:
        r = np.array([bits & 0xFF800000], dtype=np.uint32).view(np.float32)[0] / np.float32(256)
        y32 = np.float32(f + r)
        y = float(np.array([int(y32.view(np.uint32)) & 0xFFFF0000], dtype=np.uint32).view(np.float32)[0])
    return c_int(y) & 0xFFFF


def value(dtype: str, v: float) -> np.ndarray:
    """One element as hccl_test writes `v` into a buffer of `dtype` (hccl_host_buf_init and the
    check buffers): integers wrap as C stores them, floats round, bf16 goes through fp32tobf16."""
    npdt = numpy_dtype(dtype)
    if dtype == "bfloat16":
        return np.array([bf16_bits(v)], dtype=np.uint16).view(npdt)
    if dtype in BYTE_TYPES:
        return _wrap(int(v), np.dtype(np.int8)).view(npdt)
    if npdt.kind in "iu":
        return _wrap(c_int(v, npdt.itemsize * 8) if isinstance(v, float) else int(v), npdt)
    return np.array([np.float32(v) if dtype == "float16" else v], dtype=npdt)


def host(dtype: str, val: int, n: int) -> np.ndarray:
    """hccl_host_buf_init(buf, n, dtype, val): n elements of val (bytes: val % 128)."""
    return np.repeat(value(dtype, val % 128 if dtype in BYTE_TYPES else val), n)


def reduce_check(dtype: str, val: int, redop: str, p: int, n: int) -> np.ndarray:
    """hccl_reduce_check_buf_init(buf, n, dtype, op, val, p): what a reduction of p ranks' val gives,
    as each type's function writes it (int8 and uint8 clamp at 127)."""
    if dtype in ("int8", "uint8"):
        base = val % 128
        if redop == "sum":
            n8 = min(base * p, 127)
        elif redop == "prod":
            n8 = min(c_int(float(base) ** p), 127)
        else:
            n8 = min(val, 127) % 128
        return np.repeat(_wrap(n8, np.dtype(np.int8)).view(numpy_dtype(dtype)), n)
    if redop == "sum":
        v = _wrap(val * p, np.dtype(np.int32))[0].item()        # int * int in C
        v = float(v) if dtype in ("float32", "float16", "float64", "bfloat16") else v
    elif redop == "prod":
        v = float(val) ** p
        v = float(np.float32(v)) if dtype in ("float32", "float16", "bfloat16") else v
        if dtype in ("int64", "uint64"):
            return np.repeat(_wrap(c_int(v, 64), np.dtype(np.int64)).view(numpy_dtype(dtype)), n)
    else:
        v = val
    return np.repeat(value(dtype, v), n)


def inputs(op: str, rank: int, p: int, n: int, dtype: str, redop: str, root: int) -> np.ndarray:
    """Rank `rank`'s input of n elements (the whole send buffer) in `op`'s hccl_test binary."""
    npdt = numpy_dtype(dtype)
    if op == "alltoall":
        return np.resize(PATTERN, n * npdt.itemsize).view(npdt)
    if op in ("allreduce", "reduce"):
        return host(dtype, 2, n)
    if op == "broadcast":       # only the root's buffer is written (the others' are whatever it held)
        return host(dtype, 2, n) if rank == root else np.zeros(n, dtype=npdt)
    if op in ("reducescatter", "reducescatterv"):
        if redop == "prod" or dtype == "int8":
            return host(dtype, 2, n)
        return np.concatenate([host(dtype, i + 1, n // p) for i in range(p)])
    if op == "scatter":
        return (np.concatenate([host(dtype, i + 1, n // p) for i in range(p)]) if rank == root
                else np.zeros(n, dtype=npdt))
    return host(dtype, rank + 1, n)           # allgather(v), alltoallv(c)


def expected(op: str, rank: int, p: int, n: int, dtype: str, redop: str, root: int):
    """Rank `rank`'s expected output of n elements, or None where it checks nothing (Reduce off
    the root)."""
    if op in ("allreduce", "reduce"):
        return reduce_check(dtype, 2, redop, p, n) if op == "allreduce" or rank == root else None
    if op in ("reducescatter", "reducescatterv"):
        val = 2 if redop == "prod" or dtype == "int8" else rank + 1
        return reduce_check(dtype, val, redop, p, n)
    if op == "broadcast":
        return host(dtype, 2, n)
    if op == "scatter":
        return host(dtype, rank + 1, n)
    if op == "alltoall":
        return _alltoall_expected(rank, p, n, dtype)
    # allgather(v), alltoallv(c): block i holds i + 1 (the AlltoAllV check's (T)(i + 1))
    return np.concatenate([value(dtype, (i + 1) & 0xFF if dtype in BYTE_TYPES else i + 1).repeat(n // p)
                           for i in range(p)])


def _alltoall_expected(rank: int, p: int, n: int, dtype: str) -> np.ndarray:
    """hccl_alltoall_check_result: received block i, byte j, is pattern[(block · rank + j) % 8]."""
    block = n * numpy_dtype(dtype).itemsize // p
    one = PATTERN[(block * rank + np.arange(block)) % 8]
    return np.tile(one, p).view(numpy_dtype(dtype))


def wrong(op: str, dtype: str, got: np.ndarray, want, p: int) -> tuple:
    """(what the source's check function returns, True where that is a count of wrong elements
    it prints as "total err is N"). No match for the type: (1, False), "no match datatype"."""
    if want is None:
        return 0, False
    if op in CHECKED and dtype not in CHECKED[op]:
        return 1, False
    got = np.ascontiguousarray(got).reshape(-1)
    size = numpy_dtype(dtype).itemsize
    if dtype == "float32":
        c, r = want.astype(np.float32), got.astype(np.float32)
        diff = np.abs(c - r)
        rel = np.divide(diff, np.abs(r), out=np.zeros_like(diff), where=np.abs(r) > 0)
        bad = (diff > 1e-6) & np.where(np.abs(r) > 0, rel > 1e-4, diff > 0.001)
    else:
        bad = np.any(got.view(np.uint8).reshape(-1, size) != want.view(np.uint8).reshape(-1, size), axis=1)
    if op == "alltoall":
        return int(bad.any()), False                 # a bool: one failure whatever the blocks
    if op in ("alltoallv", "alltoallvc"):
        return int(bad.reshape(p, -1).any(axis=1).sum()) if bad.size else 0, False   # blocks with an error
    return int(bad.sum()), True
