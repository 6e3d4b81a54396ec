"""Reduction operations and data types: HCCL's names, nccl-tests' names, and numpy's.

HcclReduceOp is SUM, PROD, MAX, MIN (no AVG; docs/references.md §9.3). Data types follow
HcclDataType, all 17 of them; bfloat16 and the three fp8 types come from ml_dtypes, imported only
when one of them is asked for by name (importing it costs ~0.7 s, paid by every spawned rank process
otherwise). HIF8 (HiFloat8) and INT128 have no numpy or ml_dtypes type: they are byte containers of
their size (1 and 16 bytes, HCCL's DATATYPE_SIZE_TABLE), structured numpy types named by their fields,
which every op moves bit for bit and none reduces. Which types a device takes for which op is
`type_rules` (`check_type`).
"""
from __future__ import annotations

import enum

import numpy as np

from topologies.errors import HcclError

from . import type_rules


class ReduceOp(str, enum.Enum):
    SUM = "sum"
    PROD = "prod"
    MAX = "max"
    MIN = "min"

    def __str__(self):
        return self.value


_UFUNC = {ReduceOp.SUM: np.add, ReduceOp.PROD: np.multiply, ReduceOp.MAX: np.maximum, ReduceOp.MIN: np.minimum}


def parse_reduce_op(op) -> ReduceOp:
    if isinstance(op, ReduceOp):
        return op
    if isinstance(op, str):
        try:
            return ReduceOp(op.lower())
        except ValueError:
            pass
    raise HcclError("E_PARA", f"unsupported reduce op {op!r}; expected one of sum, prod, max, min")


def reduce_ufunc(op: ReduceOp):
    """The numpy ufunc of a reduce op: called as ufunc(a, b, out)."""
    return _UFUNC[op]


def reducer(op: ReduceOp):
    """f(a, b, out): out = a (op) b, element-wise, without temporaries."""
    ufunc = _UFUNC[op]

    def reduce(a, b, out):
        ufunc(a, b, out=out)
    return reduce


# canonical name -> (numpy dtype, nccl-tests name, HCCL name)
DTYPES = {
    "int8": (np.dtype(np.int8), "int8", "int8"),
    "int16": (np.dtype(np.int16), "int16", "int16"),
    "int32": (np.dtype(np.int32), "int32", "int32"),
    "int64": (np.dtype(np.int64), "int64", "int64"),
    "uint8": (np.dtype(np.uint8), "uint8", "uint8"),
    "uint16": (np.dtype(np.uint16), "uint16", "uint16"),
    "uint32": (np.dtype(np.uint32), "uint32", "uint32"),
    "uint64": (np.dtype(np.uint64), "uint64", "uint64"),
    "float16": (np.dtype(np.float16), "half", "fp16"),
    "float32": (np.dtype(np.float32), "float", "fp32"),
    "float64": (np.dtype(np.float64), "double", "fp64"),
    "bfloat16": (None, "bfloat16", "bfp16"),          # numpy dtype filled in by numpy_dtype()
    # HCCL_DATA_TYPE_FP8E4M3 15, FP8E5M2 16, FP8E8M0 17 (§9.3): OCP's e4m3 without infinities (as
    # torch's float8_e4m3fn), e5m2, and the unsigned power-of-two scale e8m0 (ml_dtypes' "fnu")
    "float8_e4m3fn": (None, "f8e4m3", "fp8e4m3"),
    "float8_e5m2": (None, "f8e5m2", "fp8e5m2"),
    "float8_e8m0fnu": (None, "f8e8m0", "fp8e8m0"),
    # HCCL_DATA_TYPE_HIF8 14 and INT128 12 (§9.3): containers of their bytes (INT128 two's
    # complement, little-endian, as its two 64-bit halves)
    "hif8": (np.dtype([("hif8", "u1")]), "hif8", "hif8"),
    "int128": (np.dtype([("int128_lo", "<u8"), ("int128_hi", "<i8")]), "int128", "int128"),
}
_ML_DTYPES = ("bfloat16", "float8_e4m3fn", "float8_e5m2", "float8_e8m0fnu")
"""Types numpy lacks, held by ml_dtypes under these names."""
_ALIASES = {"fp16": "float16", "half": "float16", "fp32": "float32", "float": "float32",
            "fp64": "float64", "double": "float64", "bf16": "bfloat16", "bfp16": "bfloat16",
            "char": "int8", "int": "int32", "uchar": "uint8",
            "fp8e4m3": "float8_e4m3fn", "float8_e4m3": "float8_e4m3fn", "f8e4m3": "float8_e4m3fn",
            "fp8e5m2": "float8_e5m2", "f8e5m2": "float8_e5m2",
            "fp8e8m0": "float8_e8m0fnu", "float8_e8m0": "float8_e8m0fnu", "f8e8m0": "float8_e8m0fnu"}
CONTAINERS = ("hif8", "int128")
"""Types held as their bytes: no arithmetic on them here (HCCL reduces neither)."""


_NAME_CACHE = {}


def dtype_name(dtype) -> str:
    """Canonical name of a numpy dtype or a dtype name; HcclError if HCCL has no such type."""
    try:
        return _NAME_CACHE[dtype]
    except (KeyError, TypeError):
        pass
    name = _dtype_name(dtype)
    try:
        _NAME_CACHE[dtype] = name
    except TypeError:
        pass
    return name


def _dtype_name(dtype) -> str:
    if isinstance(dtype, str):
        name = _ALIASES.get(dtype.lower(), dtype.lower())
        if name in DTYPES:
            return name
    elif dtype is not None:        # np.dtype(None) is float64: never a silent default
        try:
            dt = np.dtype(dtype)
        except (TypeError, ValueError):
            dt = None
        if dt is not None:
            if dt.name in _ML_DTYPES and type(dt).__module__.startswith("ml_dtypes"):
                return dt.name      # an array of it exists, so ml_dtypes is already imported
            for name, (npdt, _, _) in DTYPES.items():
                if npdt is not None and npdt == dt:
                    return name
    raise HcclError("E_PARA", f"unsupported data type {dtype!r}; HCCL supports {', '.join(DTYPES)}")


def numpy_dtype(name: str) -> np.dtype:
    name = dtype_name(name)
    npdt, nccl, hccl = DTYPES[name]
    if npdt is None:
        import ml_dtypes
        npdt = np.dtype(getattr(ml_dtypes, name))
        DTYPES[name] = (npdt, nccl, hccl)
    return npdt


def hccl_type_name(name: str) -> str:
    """HCCL's (and hccl_test's -d) name of a type: fp32, bfp16, fp8e4m3, ..."""
    return DTYPES[dtype_name(name)][2]


def check_type(dtype, rules_name: str, where: str, redop=None) -> str:
    """The canonical name of `dtype` when the device whose rules are `rules_name`
    (DeviceModel.data_types) takes it for the op at `where` (a reduction when `redop` is given);
    else E_NOT_SUPPORT with HCCL's message for it (type_rules)."""
    name = dtype_name(dtype)
    refusal = type_rules.rules(rules_name).refusal(name, where, redop)
    if refusal is not None:
        raise HcclError("E_NOT_SUPPORT", refusal)
    return name


def integers_as(values: np.ndarray, name: str) -> np.ndarray:
    """Integer `values` in the type `name`: converted, or a container's two's-complement bytes."""
    npdt = numpy_dtype(name)
    if name not in CONTAINERS:
        return values.astype(npdt)
    low = np.asarray(values, dtype=np.int64)
    if name == "hif8":
        return low.astype(np.uint8).view(npdt)
    halves = np.stack([low.view(np.uint64), (low >> 63).view(np.uint64)], axis=-1)   # the high half: the sign
    return np.ascontiguousarray(halves).view(npdt).reshape(low.shape)


def nccl_name(name: str) -> str:
    return DTYPES[dtype_name(name)][1]
