"""torch tensors as the numpy arrays hccl-sim's Communicator takes (no copy), and torch's reduce
ops as HCCL's."""
from __future__ import annotations

import numpy as np
import torch
import torch.distributed as dist

from topologies.errors import HcclError


def as_numpy(t: torch.Tensor) -> np.ndarray:
    """The tensor's storage as a numpy array (bfloat16 through ml_dtypes), no copy."""
    if t.device.type != "cpu":
        raise HcclError("E_PARA", f"hccl_sim tensors live on the CPU, got one on {t.device}")
    if not t.is_contiguous():
        raise HcclError("E_PARA", "hccl_sim collectives need contiguous tensors")
    if t.dtype == torch.bfloat16:
        import ml_dtypes
        return t.detach().view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return t.detach().numpy()


_HCCL_OPS = {"SUM": "sum", "PRODUCT": "prod", "MIN": "min", "MAX": "max", "AVG": "sum", "PREMUL_SUM": "sum"}


class Reduction:
    """A torch ReduceOp as HCCL runs it: `op` (HCCL's sum, prod, min or max); AVG is a SUM whose
    result is divided by the group's size, PREMUL_SUM (FSDP's, DDP's gradient scaling) a SUM of
    the inputs each multiplied by its factor first (torch_npu does both around HCCL, which has
    neither). Bitwise ops are refused: HCCL has none."""
    __slots__ = ("op", "factor", "divisor")

    def __init__(self, opts, size):
        torch_op = dist.ReduceOp.SUM if opts is None else opts.reduceOp
        name = next((n for n in _HCCL_OPS if torch_op == getattr(dist.ReduceOp, n)), None)
        if name is None:
            raise HcclError("E_NOT_SUPPORT", f"reduce op {getattr(torch_op, 'op', torch_op)}: HCCL reduces with SUM, "
                            "PRODUCT, MIN and MAX (and hccl_sim's torch layer AVG and PREMUL_SUM over SUM), not bitwise ops")
        self.op = _HCCL_OPS[name]
        self.factor = _factor(torch_op) if name == "PREMUL_SUM" else None
        self.divisor = size if name == "AVG" else None

    def input(self, x: np.ndarray, in_place: bool = False) -> np.ndarray:
        """What the collective reduces: x, or x times the factor (in place when x is the output)."""
        if self.factor is None:
            return x
        if in_place:
            x *= x.dtype.type(self.factor)
            return x
        return (x * self.factor).astype(x.dtype, copy=False)

    def finish(self, t: torch.Tensor) -> None:
        """The result tensor, divided for AVG."""
        if self.divisor is not None:
            t.div_(self.divisor)


def _factor(torch_op) -> float:
    """A PREMUL_SUM's factor (a float, or a one-element tensor), from the op's pickled state."""
    factor = torch_op.__getstate__()[1]
    return float(factor.item()) if isinstance(factor, torch.Tensor) else float(factor)
