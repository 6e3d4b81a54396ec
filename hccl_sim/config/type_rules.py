"""Which data types HCCL takes on each device, for which ops, and what it says when it refuses one.

A preset names its rules (`DeviceModel.data_types`, a preset YAML's `device_model.data_types`);
each follows the code that checks types on that device (docs/references.md §9.3):

- `hcomm_910b`, Atlas A2 (910B) and A3 (910_93): hcomm's legacy path, read at
  libochao-huawei/hcomm@8958adbf. Every op passes `HcomCheckDataType`
  (`src/legacy/ascend910/framework/common/src/param_check.cc`: HCCL_SUPPORT_DATA_TYPE, the twelve
  numeric types and int128, no hif8 and no fp8); a reduction then passes
  `HcclCommunicator::CheckDataType(dataType, true)` (`impl/hccl_communicator_host.cc`: no uint8,
  uint16, uint32, uint64, fp64; hccl-sim reduces uint64 and fp64 all the same, a stated deviation:
  its trainer and torch backend reduce float64 as gloo does) and `CheckReduceDataType` (no prod of
  int16 or bf16).
- `hcomm_910`, Atlas training (910A): the same path; `CheckReduceDataType` refuses every reduction
  of int16 there.
- `hccl_ops`, Ascend 950 (and 960): the open-source HCCL's own ops, read at hicann/hccl@09300b70,
  `src/ops/op_common/op_common.cc` `CheckDataType` (a reduction: no uint8, uint16, uint32, int128,
  hif8, fp8; any other op: no int128) and `CheckReduceOp` (prod of int8, int32, int64, uint64,
  fp16, fp32, fp64 only).
- `synthetic`, the flat synthetic presets, which model no device: every type some device takes,
  for the ops some device takes it for (the union of the three).

int128 reductions pass hcomm's checks on A2 and A3 (nothing there names int128 for a reduction),
but int128 is outside the range its refusal message gives for reductions and the API documents no
reduction of it (HcclAllReduce.md): refused, an assumption.
"""
from __future__ import annotations

from typing import NamedTuple

from topologies.errors import HcclError

LOG_NAME = {"float8_e4m3fn": "fp8e4m3", "float8_e5m2": "fp8e5m2", "float8_e8m0fnu": "fp8e8m0"}
"""HCCL's log name of a type (GetDataTypeEnumStr) where it is not hccl-sim's canonical name."""

_NUMERIC = ("int8", "int16", "int32", "float16", "float32", "int64", "uint64", "uint8", "uint16", "uint32",
            "float64", "bfloat16")
_EIGHT_BIT_FLOATS = ("hif8", "float8_e4m3fn", "float8_e5m2", "float8_e8m0fnu")


class TypeRules(NamedTuple):
    """The types one device moves and reduces, each list in the order HCCL's messages
    give it; `by_op`, what the third check leaves of `reduced` for a reduce op ("*": for any);
    `checks`, the function refusing each (a move, a reduction, a reduce op's type), named in messages."""
    checks: tuple
    moved: tuple
    reduced: tuple
    by_op: dict
    moved_range: bool      # whether HCCL's refusal of a moved type names the range (hccl's does, hcomm's not)

    def refusal(self, name: str, op: str, redop) -> str | None:
        """HCCL's message refusing `name` for `op` (a reduction when `redop` is given), else None;
        `op` prefixes it unless empty (an HcclError naming its op already)."""
        log, op = LOG_NAME.get(name, name), f"{op}: " if op else ""
        if redop is None:
            if name in self.moved:
                return None
            support = f", support range=[{_names(self.moved)}]" if self.moved_range else ""
            return f"{op}data type[{log}] not supported{support} ({self.checks[0]})"
        if name not in self.reduced:
            return f"{op}data type[{log}] not supported, support range=[{_names(self.reduced)}] ({self.checks[1]})"
        allowed = self.by_op.get(str(redop), self.by_op.get("*"))
        if allowed is not None and name not in allowed:
            return (f"{op}reduceop is [{redop}] data type[{log}] not supported, support range="
                    f"[{_names(allowed)}] ({self.checks[2]})")
        return None


def _names(types) -> str:
    return ", ".join(LOG_NAME.get(t, t) for t in types)


_HCOMM_REDUCED = ("int8", "int16", "int32", "float16", "float32", "bfloat16", "int64")
# Reduced on A2 / A3 / 910A although hcomm's CheckDataType refuses them there (a stated deviation,
# docs/references.md §9.3): hccl-sim's numpy trainer and its torch backend reduce float64 (and
# uint64) tensors, as gloo does, on these presets.
_HCOMM_REDUCED_TOO = ("uint64", "float64")
_HCCL_OPS_MOVED = ("int8", "int16", "int32", "int64", "float16", "float32", "uint8", "uint16", "uint32", "uint64",
                   "float64") + _EIGHT_BIT_FLOATS + ("bfloat16",)
_HCCL_OPS_REDUCED = ("int8", "int16", "int32", "int64", "float16", "float32", "bfloat16", "uint64", "float64")
_HCCL_OPS_MULTIPLIED = ("int8", "int32", "int64", "uint64", "float16", "float32", "float64")

_HCOMM = "hcomm's legacy path on {}: "
_HCOMM_CHECKS = ("HcomCheckDataType, param_check.cc", "HcclCommunicator::CheckDataType, hccl_communicator_host.cc",
                 "CheckReduceDataType, hccl_communicator_host.cc")
_HCCL_OPS_CHECKS = ("HCCL's CheckDataType, op_common.cc",) * 2 + ("HCCL's CheckReduceOp, op_common.cc",)

RULES = {
    "hcomm_910b": TypeRules(tuple(_HCOMM.format("910B and 910_93") + c for c in _HCOMM_CHECKS),
                            _NUMERIC + ("int128",), _HCOMM_REDUCED + _HCOMM_REDUCED_TOO,
                            {"prod": tuple(t for t in _HCOMM_REDUCED + _HCOMM_REDUCED_TOO
                                           if t not in ("int16", "bfloat16"))}, False),
    "hcomm_910": TypeRules(tuple(_HCOMM.format("910") + c for c in _HCOMM_CHECKS),
                           _NUMERIC + ("int128",), _HCOMM_REDUCED + _HCOMM_REDUCED_TOO,
                           {"*": tuple(t for t in _HCOMM_REDUCED + _HCOMM_REDUCED_TOO if t != "int16")}, False),
    "hccl_ops": TypeRules(_HCCL_OPS_CHECKS, _HCCL_OPS_MOVED, _HCCL_OPS_REDUCED, {"prod": _HCCL_OPS_MULTIPLIED}, True),
    "synthetic": TypeRules(("a synthetic preset takes what some HCCL device takes",) * 3,
                           _HCCL_OPS_MOVED + ("int128",), _HCCL_OPS_REDUCED, {"prod": _HCCL_OPS_MULTIPLIED}, True),
}


def rules(name: str) -> TypeRules:
    """A preset's rules by the name its YAML gives."""
    try:
        return RULES[name]
    except KeyError:
        raise HcclError("E_PARA", f"unknown data_types {name!r} in a preset; expected one of {', '.join(RULES)}") \
            from None
