"""The argument checks torch_npu's ProcessGroupHCCL makes before HCCL sees a call, in its words.

Where torch_npu's backend (and gloo's, which shares c10d's texts) refuses an argument, a script on
hccl-sim gets the same text, so a test that matches torch_npu's message passes here too
(docs/references.md §7.5): the TORCH_CHECK's text followed by DIST_ERROR's suffix, a line
"[ERROR] <time> (PID:<pid>, Device:<card>, RankID:<RANK>) ERR02<code> DIST <what>", which
TORCH_NPU_COMPACT_ERROR_OUTPUT=1 leaves out, as torch_npu's formatErrorCode does. The error is an
HcclError (code E_PARA or E_NOT_SUPPORT, cause BAD_INPUT) and so a RuntimeError, the type
torch_npu's c10::Error reaches Python as.
"""
from __future__ import annotations

import os
import time

from topologies.errors import Cause, HcclError

# torch_npu's ErrCode values and errCodeMap's words (NPUException.h / NPUException.cpp)
_ERR_CODES = {"PARAM": (1, "invalid parameter"), "TYPE": (2, "invalid type"), "VALUE": (3, "invalid value"),
              "NOT_SUPPORT": (7, "feature not supported"), "NOT_FOUND": (8, "resource not found"),
              "TIMEOUT": (11, "timeout error")}
_HCCL_CODES = {"NOT_SUPPORT": "E_NOT_SUPPORT", "NOT_FOUND": "E_NOT_SUPPORT", "TIMEOUT": "E_TIMEOUT"}
_DIST = 2                       # SubModule::DIST


def dist_error(kind: str, card: int = -1) -> str:
    """torch_npu's DIST_ERROR(ErrCode::kind) suffix (formatErrorCode), or "" under
    TORCH_NPU_COMPACT_ERROR_OUTPUT. `card`: the device the process set (-1: none)."""
    if _flag("TORCH_NPU_COMPACT_ERROR_OUTPUT"):
        return ""
    code, words = _ERR_CODES[kind]
    rank = os.environ.get("RANK", "-1")
    stamp = time.strftime("%Y-%m-%d-%H:%M:%S")
    return f"\n[ERROR] {stamp} (PID:{os.getpid()}, Device:{card}, RankID:{rank}) ERR{_DIST:02d}{code:03d} DIST {words}"


class TorchNpuCheck(HcclError):
    """An argument torch_npu's backend refuses, raised with its text (str() is that text and
    DIST_ERROR's suffix); `.code` and `.reason` are hccl-sim's as for any HcclError."""

    def __init__(self, text: str, kind: str = "PARAM", rank: int | None = None, card: int = -1):
        super().__init__(_HCCL_CODES.get(kind, "E_PARA"), text, rank=rank, cause=Cause.BAD_INPUT)
        self.kind, self.card = kind, card
        self.args = (text + dist_error(kind, card),)

    def __str__(self):
        return self.args[0]

    def __reduce__(self):
        return _rebuilt, (self.reason, self.kind, self.rank, self.card, self.args[0])


def _rebuilt(text, kind, rank, card, shown):
    err = TorchNpuCheck(text, kind, rank, card)
    err.args = (shown,)
    return err


def _flag(name: str) -> bool:
    try:
        return int(os.environ.get(name, "0") or 0) != 0
    except ValueError:
        return False


def check_split_sizes(split_sizes, rows: int, group_size: int, card: int = -1) -> None:
    """torch_npu's check_split_sizes (c10d's checkSplitSizes, the same texts) for all_to_all_single."""
    if not split_sizes:
        if rows % group_size:
            raise TorchNpuCheck("Tensor's dim 0 does not divide equally across group size", "PARAM", card=card)
        return
    if len(split_sizes) != group_size:
        raise TorchNpuCheck("Number of tensor splits not equal to group size", "TYPE", card=card)
    if sum(int(s) for s in split_sizes) != rows:
        raise TorchNpuCheck("Split sizes doesn't match total dim 0 size", "TYPE", card=card)


def check_reduce_op(name: str, dtype, card: int = -1) -> None:
    """torch_npu's getHcclReduceOp refusals: bitwise ops, an op it does not know (`name` None), and
    PREMUL_SUM outside the float types."""
    if name is None:
        raise TorchNpuCheck("Unhandled ReduceOp", "NOT_FOUND", card=card)
    if name in ("BAND", "BOR", "BXOR"):
        raise TorchNpuCheck(f"Cannot use ReduceOp.{name} with HCCL", "NOT_SUPPORT", card=card)
    if name == "PREMUL_SUM" and str(dtype) not in ("torch.float16", "torch.float32", "torch.bfloat16",
                                                   "torch.float64"):
        raise TorchNpuCheck("PreMulSum Data type must be half, float, bfloat16 or double", "TYPE", card=card)


def check_dense(tensor, device_type: str, card: int = -1) -> None:
    """torch_npu's check_npu_single_tensor on a group that serves `device_type`: a tensor of that
    device, dense and contiguous ("Tensors must be NPU and dense" on an npu group)."""
    if tensor.device.type != device_type or tensor.is_sparse:
        raise TorchNpuCheck(f"Tensors must be {device_type.upper()} and dense", "TYPE", card=card)
    if not tensor.is_contiguous():
        raise TorchNpuCheck("Tensors must be contiguous", "TYPE", card=card)
