"""torch tensors as the numpy arrays hccl-sim's Communicator takes (no copy)."""
from __future__ import annotations

import numpy as np
import torch

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
