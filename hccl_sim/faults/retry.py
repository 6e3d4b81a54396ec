"""HCCL's op retry (re-execution) and its error reports, on simulated time (docs/references.md §10.4,
§10.3, §10.6; docs/design.md, "Faults contract").

When a transfer's retransmissions run out (an error CQE, hcomm.link_state.LinkFailure) the op fails at
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

Backup NIC (借轨, docs/references.md §10.5): on A3, when an L2 (inter-superpod) retry meets a die's RoCE NIC that is
down for good, the retry switches that die to its package partner's NIC (`backup_device_ip`):
both ends of its connections switch (it sends from the partner's NIC, its peers send to it
there), once per NPU, no switch back, the two dies sharing the NIC at half bandwidth
(topologies.presets.with_backup_nics prices the borrowed routes). Elsewhere, or when the partner's
NIC is down too, or the NPU already switched once, the error stands and its message says why no
backup was used.
"""
from __future__ import annotations

import logging

from hcomm.link_state import LinkFailure
from topologies.errors import Cause, HcclError
from topologies.presets import package_partner

log = logging.getLogger("hccl_sim.faults.retry")
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


def exception_location(f: LinkFailure, op: str, algo: str, level: str) -> str:
    """HCCL's `Cluster Exception Location` sentence of an error CQE in op `op` (its name)."""
    where = " -> ".join(str(h) for h in f.hops) if f.hops else f"rank {f.src} -> rank {f.dst}"
    step = "" if f.step is None else f", step {f.step}"
    return (f"Cluster Exception Location[link {where} ({level})], op {op}, algorithm {algo}"
            f"{step}, simulated time {f.time_ns / 1e9:.6f} s: error CQE, rank {f.src} -> rank {f.dst} failed after "
            f"{f.attempts} attempts ({f.label})")


def failure_fields(f: LinkFailure, level: str) -> dict:
    """An error CQE's facts as HcclError fields: the failed transfer's link and level, the fault
    plan entry that failed it, when, after how many attempts."""
    return {"link": (f.src, f.dst), "level": level, "fault": f.label, "time_ns": f.time_ns,
            "detail": {"attempts": f.attempts}}


def _failed_nic(f: LinkFailure, cost):
    """The die whose RoCE NIC (its edge to the RoCE fabric) is down for good in failure `f`, or None."""
    links = cost.link_state
    for edge in f.down_edges:
        if "roce" in edge and links.down_for_good(edge, f.time_ns):
            other = edge[0] if edge[1] == "roce" else edge[1]
            if other.isdigit():
                return int(other)
    return None


def backup_nic(f: LinkFailure, cost, level: str, enabled: bool, backup: tuple):
    """(die to switch to its partner's NIC, None) when the retry can borrow one; (None, why not)
    when the failure is a NIC down for good that no backup can replace; (None, None) otherwise."""
    die = _failed_nic(f, cost)
    if die is None:
        return None, None
    topo = cost.topology
    if topo.params.get("superpod_of_server") is None:
        return None, (f"on {topo.device} a NIC has no backup (HCCL borrows the other die's NIC of a 910C package, "
                      "A3 only)")
    if level != "L2":
        return None, f"HCCL borrows a backup NIC only in an L2 (inter-superpod) retry, and this link is {level}"
    partner = package_partner(topo, die)
    if partner is None:
        return None, f"rank {die} has no partner die in its server to borrow a NIC from"
    if not enabled:
        return None, f"the backup NIC (rank {partner}'s) is borrowed only by an op retry, which is off for L2"
    if die in backup or partner in backup:
        return None, (f"the NPU of ranks {min(die, partner)} and {max(die, partner)} already switched to a backup NIC "
                      "(HCCL switches once per NPU, no switch back)")
    if cost.link_state.down_at(tuple(sorted((str(partner), "roce"))), f.time_ns):
        return None, f"the partner die's NIC (rank {partner}'s) is down too"
    return die, None


def priced_with_retry(price, sig, algo: str, cost, config, entry: list, backup: tuple = ()):
    """(price's result, tries retried, history, backup, notes) for an op whose pricing may meet a
    failed link. `price(entry clocks, backup dies)` prices one try; history lists every try as
    (entry clocks, its LinkFailure or None for the one that succeeded, the backup dies it ran with);
    `backup` ends as the dies on their partner's NIC after the op, `notes` says what was switched."""
    params = dict(config.retry_params)
    enabled = dict(config.retry_enable)
    tries = 0
    current = list(entry)
    history = []
    notes = []
    while True:
        try:
            result = price(current, backup)
            history.append((current, None, backup))
            return result, tries, history, backup, tuple(notes)
        except LinkFailure as f:
            # the plan keeps every try's failure (the trace shows each); without its traceback, which
            # would keep this call's whole stack alive, and with it the op's buffers (its caller's
            # result segments on Ray) for as long as the plan lives
            history.append((current, f.with_traceback(None), backup))
            level = level_of(cost, f.src, f.dst)
            where = exception_location(f, sig.name, algo, level)
            switch, no_backup = backup_nic(f, cost, level, enabled.get(level, False), backup)
            why = f"; no backup NIC: {no_backup}" if no_backup else ""
            facts = failure_fields(f, level)
            if no_backup:
                facts["detail"]["no_backup"] = no_backup
            if not enabled.get(level, False):
                raise HcclError("E_REMOTE", f"{where}; op retry is off for {level} (HCCL_OP_RETRY_ENABLE){why}",
                                op=sig.name, cause=Cause.LINK_FAILED, **facts) from None
            refused = {"max_cnt": params["MaxCnt"], "tries": tries}
            if sig.inplace:
                facts["detail"].update(refused, refused="in-place")
                raise HcclError("E_OPRETRY_FAIL", f"{where}; cannot retry an in-place op (out= aliases the input, "
                                "HCCL's sendBuf == recvBuf): its input is overwritten", op=sig.name,
                                cause=Cause.OPRETRY_FAIL, **facts) from None
            if f.finished:
                left = ", ".join(f"rank {r}" for r in f.finished[:8]) + (", ..." if len(f.finished) > 8 else "")
                facts["detail"].update(refused, refused="left", left=tuple(f.finished))
                raise HcclError("E_OPRETRY_FAIL", f"{where}; cannot retry: {left} had already left the op (HCCL "
                                "retries only when every rank is stopped in the same op)", op=sig.name,
                                cause=Cause.OPRETRY_FAIL, **facts) from None
            if tries >= params["MaxCnt"]:
                facts["detail"].update(refused, refused="exhausted")
                raise HcclError("E_OPRETRY_FAIL", f"{where}; retries exhausted: {tries} of MaxCnt={params['MaxCnt']} "
                                f"tried while the link stayed down{why}", op=sig.name, cause=Cause.OPRETRY_FAIL,
                                **facts) from None
            tries += 1
            if not cost.topology.device_model.op_retry:
                log.warning("op retry on %s: real HCCL retries ops only on A3 (910C); hccl-sim retries here too",
                            cost.topology.device)
            wait = params["HoldTime"] * MS + (params["IntervalTime"] * MS if tries > 1 else 0)
            current = [f.time_ns + wait] * len(entry)
            if switch is not None:
                partner = package_partner(cost.topology, switch)
                backup = tuple(sorted(backup + (switch,)))
                notes.append(f"backup NIC: rank {switch}'s NIC is down for good ({f.label}); from retry {tries} "
                             f"({current[0] / 1e9:.6f} s) its RoCE traffic goes through rank {partner}'s NIC over "
                             "SIO, both dies at half bandwidth (HCCL's backup_device_ip, once per NPU)")
                log.warning("op %s: %s", sig.name, notes[-1])
