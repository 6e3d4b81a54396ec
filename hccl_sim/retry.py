"""HCCL's op retry (re-execution) and its error reports, on simulated time (reference/hccl.md §8.3,
§8.2; DESIGN.md "Faults contract").

When a transfer's retransmissions run out (an error CQE, hcomm.faults.LinkFailure) the op fails at
that instant on every rank. With HCCL_OP_RETRY_ENABLE on for the failed link's level (L0 inside a
server, L1 between servers, L2 between superpods), every rank stops, the ranks agree over the
host network (not the failed link), wait HoldTime and re-run the whole op from its input; later
tries wait IntervalTime more; at most MaxCnt tries (HCCL_OP_RETRY_PARAMS). Data is moved once, by
the try that succeeds, so the result is the fault-free one bit for bit. Refused (E_OPRETRY_FAIL)
as HCCL refuses: an in-place op (its input is overwritten), a rank had already left the op when the link failed (HCCL needs every rank
stopped in the same op), or the tries ran out (the link still down). Without retry the error
CQE is E_REMOTE. Messages follow HCCL's `Cluster Exception Location` shape: the link, the op, the
algorithm, the step, the simulated time. HCCL offers op retry only on A3; elsewhere hccl-sim runs
it too and logs that real HCCL would not.
"""
from __future__ import annotations

import logging

from hcomm.faults import LinkFailure
from topologies.errors import HcclError

log = logging.getLogger("hccl_sim.retry")
MS = 1_000_000


def level_of(cost, src: int, dst: int) -> str:
    """The retry level of a link between two ranks: L0 in a server, L1 between servers of a
    superpod (or of an A2/910A cluster), L2 between superpods."""
    so = cost.server_of
    if so[src] == so[dst]:
        return "L0"
    pods = cost.topology.params.get("superpod_of_server")
    if pods is not None and pods[so[src]] != pods[so[dst]]:
        return "L2"
    return "L1"


def exception_location(f: LinkFailure, sig, algo: str, level: str) -> str:
    where = " -> ".join(str(h) for h in f.hops) if f.hops else f"rank {f.src} -> rank {f.dst}"
    return (f"Cluster Exception Location[link {where} ({level})], op {sig.name}, algorithm {algo}, step {f.step}, "
            f"simulated time {f.time_ns / 1e9:.6f} s: error CQE, rank {f.src} -> rank {f.dst} failed after "
            f"{f.attempts} attempts ({f.label})")


def priced_with_retry(price, sig, algo: str, cost, config, entry: list):
    """(price's result, tries retried, history) for an op whose pricing may meet a failed link:
    history lists every try as (entry clocks, its LinkFailure or None for the one that succeeded)."""
    params = dict(config.retry_params)
    enabled = dict(config.retry_enable)
    tries = 0
    current = list(entry)
    history = []
    while True:
        try:
            result = price(current)
            history.append((current, None))
            return result, tries, history
        except LinkFailure as f:
            history.append((current, f))
            level = level_of(cost, f.src, f.dst)
            where = exception_location(f, sig, algo, level)
            if not enabled.get(level, False):
                raise HcclError("E_REMOTE", f"{where}; op retry is off for {level} (HCCL_OP_RETRY_ENABLE)",
                                op=sig.name) from None
            if sig.inplace:
                raise HcclError("E_OPRETRY_FAIL", f"{where}; cannot retry an in-place op (out= aliases the input, "
                                "HCCL's sendBuf == recvBuf): its input is overwritten", op=sig.name) from None
            if f.finished:
                left = ", ".join(f"rank {r}" for r in f.finished[:8]) + (", ..." if len(f.finished) > 8 else "")
                raise HcclError("E_OPRETRY_FAIL", f"{where}; cannot retry: {left} had already left the op (HCCL "
                                "retries only when every rank is stopped in the same op)", op=sig.name) from None
            if tries >= params["MaxCnt"]:
                raise HcclError("E_OPRETRY_FAIL", f"{where}; retries exhausted: {tries} of MaxCnt={params['MaxCnt']} "
                                "tried while the link stayed down", op=sig.name) from None
            tries += 1
            if cost.topology.device != "910C":
                log.warning("op retry on %s: real HCCL retries ops only on A3 (910C); hccl-sim retries here too",
                            cost.topology.device)
            wait = params["HoldTime"] * MS + (params["IntervalTime"] * MS if tries > 1 else 0)
            current = [f.time_ns + wait] * len(entry)
