"""torch tensors as the numpy arrays hccl-sim's Communicator takes (no copy), and torch's reduce
ops as HCCL's, both as torch_npu's ProcessGroupHCCL makes them (docs/references.md §7.5): bool
travels as uint8, a reduction of bool or uint8 runs on an int32 copy, AVG is a SUM divided
afterwards (an integer quotient for integer tensors), PREMUL_SUM a SUM of premultiplied inputs."""
from __future__ import annotations

import numpy as np
import torch
import torch.distributed as dist

from .checks import check_dense, check_reduce_op


def as_numpy(t: torch.Tensor) -> np.ndarray:
    """The tensor's storage as a numpy array (bfloat16 through ml_dtypes, bool as uint8: HCCL's
    types), no copy; an emulated NPU's tensor through its host bytes (hccl_sim.torch.npu). A
    sparse, non-contiguous or other device's tensor is refused in torch_npu's words."""
    if t.device.type == "npu":
        from .npu import host_tensor
        check_dense(t, "npu")
        t = host_tensor(t)
    check_dense(t, "cpu")
    if t.dtype == torch.bfloat16:
        import ml_dtypes
        return t.detach().view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    if t.dtype == torch.bool:
        return t.detach().view(torch.uint8).numpy()
    return t.detach().numpy()


_WIDENED = (torch.bool, torch.uint8)    # reduced as int32 by torch_npu (a uint8 SUM would overflow)


_HCCL_OPS = {"SUM": "sum", "PRODUCT": "prod", "MIN": "min", "MAX": "max", "AVG": "sum", "PREMUL_SUM": "sum"}


class Reduction:
    """A torch ReduceOp as HCCL runs it: `op` (HCCL's sum, prod, min or max); AVG is a SUM whose
    result is divided by the group's size, PREMUL_SUM (FSDP's, DDP's gradient scaling) a SUM of
    the inputs each multiplied by its factor first (torch_npu does both around HCCL, which has
    neither). Bitwise ops, and PREMUL_SUM on other than float types, are refused in torch_npu's
    words. A bool or uint8 tensor is reduced as an int32 copy (`working`), which `finish` divides
    (AVG) and copies back: a bool SUM is then an OR, as torch_npu's SUM-as-MAX on bool is."""
    __slots__ = ("op", "factor", "divisor")

    def __init__(self, opts, size, dtype):
        torch_op = dist.ReduceOp.SUM if opts is None else opts.reduceOp
        name = next((n for n in ("BAND", "BOR", "BXOR", *_HCCL_OPS) if torch_op == getattr(dist.ReduceOp, n)), None)
        check_reduce_op(name, dtype)
        self.op = _HCCL_OPS[name]
        self.factor = _factor(torch_op) if name == "PREMUL_SUM" else None
        self.divisor = size if name == "AVG" else None

    @staticmethod
    def working(t: torch.Tensor) -> torch.Tensor:
        """What the collective reduces in place of `t`: an int32 copy of a bool or uint8 tensor
        (torch_npu's cast before HCCL), else `t` itself."""
        return t.to(torch.int32) if t.dtype in _WIDENED else t

    def input(self, x: np.ndarray, in_place: bool = False) -> np.ndarray:
        """What the collective reduces: x, or x times the factor (in place when x is the output)."""
        if self.factor is None:
            return x
        if in_place:
            x *= x.dtype.type(self.factor)
            return x
        return (x * self.factor).astype(x.dtype, copy=False)

    def finish(self, t: torch.Tensor, work: torch.Tensor | None = None) -> None:
        """Make `t` the result: `work` (what `working` gave, default `t`) divided for AVG (an integer
        tensor by truncation, as torch_npu's div_(size, "trunc")), copied into `t` if it is not `t`."""
        work = t if work is None else work
        if self.divisor is not None:
            if work.dtype.is_floating_point or work.dtype.is_complex:
                work.div_(self.divisor)
            else:
                work.div_(self.divisor, rounding_mode="trunc")
        if work is not t:
            t.copy_(work)


def _factor(torch_op) -> float:
    """A PREMUL_SUM's factor (a float, or a one-element tensor), from the op's pickled state."""
    factor = torch_op.__getstate__()[1]
    return float(factor.item()) if isinstance(factor, torch.Tensor) else float(factor)
