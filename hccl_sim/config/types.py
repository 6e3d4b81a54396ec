"""Reduction operations and data types: HCCL's names, nccl-tests' names, and numpy's.

HcclReduceOp is SUM, PROD, MAX, MIN (no AVG; docs/references.md §9.3). Data types follow
HcclDataType; bfloat16 comes from ml_dtypes, imported only when a bfloat16 is asked for by name
(importing it costs ~0.7 s, paid by every spawned rank process otherwise).
"""
from __future__ import annotations

import enum

import numpy as np

from topologies.errors import HcclError


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
}
_ALIASES = {"fp16": "float16", "half": "float16", "fp32": "float32", "float": "float32",
            "fp64": "float64", "double": "float64", "bf16": "bfloat16", "bfp16": "bfloat16",
            "char": "int8", "int": "int32", "uchar": "uint8"}


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
            if dt.name == "bfloat16" and type(dt).__module__.startswith("ml_dtypes"):
                return "bfloat16"   # an array of it exists, so ml_dtypes is already imported
            for name, (npdt, _, _) in DTYPES.items():
                if npdt is not None and npdt == dt:
                    return name
    raise HcclError("E_PARA", f"unsupported data type {dtype!r}; HCCL supports {', '.join(DTYPES)}")


def numpy_dtype(name: str) -> np.dtype:
    name = dtype_name(name)
    npdt, nccl, hccl = DTYPES[name]
    if npdt is None:
        import ml_dtypes
        npdt = np.dtype(ml_dtypes.bfloat16)
        DTYPES[name] = (npdt, nccl, hccl)
    return npdt


def nccl_name(name: str) -> str:
    return DTYPES[dtype_name(name)][1]
