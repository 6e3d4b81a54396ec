"""HcclError: the one exception family of hccl-sim, with HCCL's HcclResult codes.

It lives in the lowest layer (topologies) so that every layer above can raise it without
depending upward: a malformed rank table (topologies), a transport deadline (hcomm) and a
mismatched collective (hccl_sim) all surface as the same exception type.
Codes and numbers are HCCL's `HcclResult` (hccl_types.h; docs/references.md §9.1).
"""
from __future__ import annotations

HCCL_RESULT = {
    "SUCCESS": 0, "E_PARA": 1, "E_PTR": 2, "E_MEMORY": 3, "E_INTERNAL": 4,
    "E_NOT_SUPPORT": 5, "E_NOT_FOUND": 6, "E_UNAVAIL": 7, "E_SYSCALL": 8, "E_TIMEOUT": 9,
    "E_OPEN_FILE_FAILURE": 10, "E_TCP_CONNECT": 11, "E_ROCE_CONNECT": 12,
    "E_TCP_TRANSFER": 13, "E_ROCE_TRANSFER": 14, "E_RUNTIME": 15, "E_DRV": 16,
    "E_PROFILING": 17, "E_CCE": 18, "E_NETWORK": 19, "E_AGAIN": 20, "E_REMOTE": 21,
    "E_SUSPENDING": 22, "E_OPRETRY_FAIL": 23, "E_OOM": 24, "E_IN_STATUS": 1041,
}


class HcclError(RuntimeError):
    """An error with an HCCL result code (`.code`, e.g. "E_PARA") and, when known, the rank.

    The message names the rank, the operation and the cause, as HCCL's error logs do.
    """

    def __init__(self, code: str, message: str, rank: int | None = None, op: str | None = None,
                 time_ns: int | None = None):
        if code not in HCCL_RESULT:
            raise ValueError(f"unknown HCCL result code {code!r}")
        self.code = code
        self.value = HCCL_RESULT[code]
        self.rank = rank
        self.op = op
        self.time_ns = time_ns      # the simulated clock at which the failure was detected, if known
        prefix = []
        if rank is not None:
            prefix.append(f"rank {rank}")
        if op is not None:
            prefix.append(op)
        where = f"[{', '.join(prefix)}] " if prefix else ""
        self.reason = message
        super().__init__(f"HCCL_{code} ({self.value}): {where}{message}")

    def __reduce__(self):
        return (type(self), (self.code, self.reason, self.rank, self.op, self.time_ns))
