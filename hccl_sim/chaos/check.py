"""What a chaos scenario's outcome is, from every rank's records of it and of its fault-free twin.

Every rank runs `rank_program`: the scenario's call, repeated, each outcome kept as data (an
HcclError is caught and recorded, so every rank's outcome is seen; a rank the plan kills returns
None). The twin is the same program with the same data and environment and no faults (running
both: hccl_sim.chaos.runners). Outcomes (docs/design.md, "Faults contract"):

- recovered: every surviving rank completed every call with a result bit-identical to the
  twin's (and the twin's equal to the numpy reference), the ranks agreeing on retries and
  algorithm, no rank faster than in the twin, and at least HoldTime (+ IntervalTime per further
  try) lost per retried op (docs/references.md §10.4);
- clean error: every survivor raised in the same call an HcclError that names a fault of the plan
  (its `fault` field: the entry's label) with a code and cause that fault can produce: E_REMOTE
  (an error CQE: LINK_FAILED, op retry off for the failed link's level), E_OPRETRY_FAIL (retry on
  but refused: in-place only for an in-place call, MaxCnt as set), E_TIMEOUT for a lost rank
  (RANK_LOST, naming the dead rank, by the heartbeat's 30 s or HCCL_EXEC_TIMEOUT, whichever the
  environment makes first, docs/references.md §10.3, not before that wait since the crash), the
  dead rank None; under an hbm_pressure that starved the first call's link setup, E_MEMORY on the
  pressured rank and E_TIMEOUT on its peers once HCCL_CONNECT_TIMEOUT + 20 s ran out
  (docs/references.md §7.2, §10.2) (a pressure that starved no link setup changes nothing);
- skipped: the engine refuses the scenario (E_NOT_SUPPORT), counted and reported;
- WRONG: anything else; HANG: a run did not end by the wall deadline; LEAK: /dev/shm segments,
  child processes, rank threads or device allocations left that were not there before.

Errors are judged by their fields (HcclError.fields(): cause, peers, level, fault, detail, kept in
each CallRecord), never by their message text; the message is only quoted.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import NamedTuple, Optional

import numpy as np

from topologies.errors import Cause, HcclError
from topologies.model import seconds_to_ns

from .. import collectives
from ..config.env import Config
from ..faults.entries import entry_label
from ..faults.fault_plan import HEARTBEAT_LOST_S, STOPPING
from ..plan.faulted import CONNECT_GRACE_S
from ..config.types import parse_reduce_op
from .scenarios import Call, Scenario, count_matrix

OUTCOMES = ("recovered", "clean error", "skipped", "WRONG", "HANG", "LEAK")
FAILURES = ("WRONG", "HANG", "LEAK")
LINK_FAILING = ("link_flap", "link_down", "nic_down")      # kinds that take links down
CQE_KINDS = LINK_FAILING + ("corrupt",)
"""Kinds an error CQE can name: a down link's, or a corrupted transfer's when its lost attempt was
the one past HCCL_RDMA_RETRY_CNT (the others lost to a down link: alone, it is retransmitted)."""
DELAYING = ("link_flap", "link_slow", "nic_down", "corrupt")
"""Kinds that can hold a transfer up (retransmitted or slowed) without failing it."""
CQE_CAUSES = {"E_REMOTE": Cause.LINK_FAILED, "E_OPRETRY_FAIL": Cause.OPRETRY_FAIL}
"""The cause an error CQE's error carries, by its code."""
HOLDING_UP = DELAYING + ("hbm_pressure",)
"""Kinds that can make a rank enter its next op late: DELAYING's, and a starved link setup, whose
peers wait out their connect timeout (140 s by default) while the starved rank goes on."""
PRESSURE_CODES = ["E_MEMORY", "E_TIMEOUT"]
"""The codes of an op whose link setup an hbm_pressure starved: the pressured rank's, its peers'."""


class CallRecord(NamedTuple):
    """One rank's outcome of one call."""
    ok: bool
    digest: Optional[str]     # the result's digest (dtype, shape, bytes); None where the call returns None
    start: int                # clock at entry, ns
    end: int                  # clock at exit (or when the error was raised), ns
    retries: int = 0
    algo: str = ""
    code: Optional[str] = None
    message: str = ""
    error: Optional[dict] = None   # the HcclError's fields (HcclError.fields()), what the checker judges


def rank_input(call: Call, rank: int, p: int) -> np.ndarray:
    """Rank `rank`'s input: integers (exact under every reduction order), different on every rank
    and element, the same in the scenario and its twin; 1 or 2 for prod (wraps, order-free). A
    variable-size op's is the rows its counts give the rank (AllGatherV's: its own block)."""
    rng = np.random.default_rng([call.data_seed, rank])
    lo, hi = (1, 3) if call.redop == "prod" else (0, 1000)
    x = rng.integers(lo, hi, size=call.count, dtype=np.dtype(call.dtype))
    return collectives.of(call.op).input_of(x, count_matrix(call, p), rank)


def digest(y) -> Optional[str]:
    if y is None:
        return None
    y = np.ascontiguousarray(y)
    return f"{y.dtype}{list(y.shape)}:{hashlib.blake2b(y.tobytes(), digest_size=12).hexdigest()}"


def rank_program(comm, call: Call) -> list:
    """Runs on every rank: the call `call.calls` times; a CallRecord each, up to the first error."""
    coll = collectives.of(call.op)
    counts = count_matrix(call, comm.size)
    method = _with_counts(getattr(comm, coll.method), coll.call_counts(counts, comm.rank))
    kwargs = {"algo": call.algo}
    if call.redop is not None:
        kwargs["op"] = call.redop
    if call.root is not None:
        kwargs["root"] = call.root
    records = []
    for _ in range(call.calls):
        x = rank_input(call, comm.rank, comm.size)
        if call.out == "inplace":
            kwargs["out"] = x
        elif call.out == "out":
            kwargs["out"] = np.empty(coll.output_shape_of(x, comm.size, counts, comm.rank), dtype=x.dtype)
        start = comm.clock
        try:
            y = method(x, **kwargs)
        except HcclError as exc:
            records.append(CallRecord(False, None, start, comm.clock, code=exc.code, message=str(exc),
                                      error=exc.fields()))
            break
        op = comm.last_op
        records.append(CallRecord(True, digest(y), op.start, op.end, op.retries, op.algo))
    return records


def _with_counts(method, counts: tuple):
    """`method` with a variable-size op's count arguments first (none for other ops)."""
    def run(x, **kwargs):
        return method(x, *counts, **kwargs)
    return run


def reference_digests(call: Call, p: int) -> list:
    """Every rank's expected result digest from numpy (hccl_sim.collectives' reference)."""
    inputs = [rank_input(call, r, p) for r in range(p)]
    redop = parse_reduce_op(call.redop) if call.redop is not None else None
    return [digest(y) for y in collectives.of(call.op).references(inputs, count_matrix(call, p), redop,
                                                                   call.root or 0)]


# ---- classification ----------------------------------------------------------------------------

@dataclass
class Verdict:
    """A scenario's outcome (one of OUTCOMES), why, and what recovering from its faults cost."""
    outcome: str
    detail: str = ""
    retries: Optional[int] = None      # op retries over the scenario's calls (recovered)
    lost_s: Optional[float] = None     # simulated time lost: last exit minus the twin's, max over ranks
    bound_s: Optional[float] = None    # the least that retries must lose: k HoldTime + (k-1) IntervalTime per op
    cqe_s: Optional[float] = None      # the failed tries' retransmission budgets: k (RETRY_CNT + 1) interval per op


def classify(sc: Scenario, twin, faulty, reference=None) -> Verdict:
    """The outcome of a scenario from every rank's records in the twin and under faults (None for
    a dead rank); `reference`: every rank's expected digest, checked against the twin."""
    wrong = _twin_problem(sc, twin, reference)
    if wrong:
        return Verdict("WRONG", wrong)
    p, calls = len(twin), sc.call.calls
    config = Config.from_env(sc.env)
    entries = sc.plan.entries
    crashing = {e["rank"] for e in entries if e["kind"] in STOPPING}
    dead = [r for r in range(p) if faulty[r] is None]
    if set(dead) - crashing:
        return Verdict("WRONG", f"rank {min(set(dead) - crashing)} returned no result, but the plan does not crash it")
    survivors = [r for r in range(p) if faulty[r] is not None]
    if not survivors:
        return Verdict("WRONG", "every rank died")
    fail_at = {}
    for r in survivors:
        recs = faulty[r]
        first = next((k for k, rec in enumerate(recs) if not rec.ok), None)
        if first is None and len(recs) != calls:
            return Verdict("WRONG", f"rank {r} made {len(recs)} of {calls} calls without an error")
        fail_at[r] = first
        for k, rec in enumerate(recs[:first]):
            mine = twin[r][k]
            if rec.digest != mine.digest:
                return Verdict("WRONG", f"rank {r} call {k}: result {rec.digest} differs from the fault-free twin's "
                                        f"{mine.digest}")
            if rec.algo != mine.algo:
                return Verdict("WRONG", f"rank {r} call {k}: ran {rec.algo!r}, the twin {mine.algo!r}")
    points = set(fail_at.values())
    if points == {None}:
        if dead:
            return Verdict("WRONG", f"rank {dead[0]} died but every survivor completed every call")
        return _recovered(sc, twin, faulty, survivors, config)
    if len(points) > 1:
        by = {}
        for r, k in fail_at.items():
            by.setdefault(k, []).append(r)
        said = "; ".join(f"ranks {rs[:6]} {'completed' if k is None else f'failed in call {k}'}"
                         for k, rs in sorted(by.items(), key=lambda kv: -1 if kv[0] is None else kv[0]))
        return Verdict("WRONG", f"ranks disagree: {said}")
    k = points.pop()
    errors = {r: faulty[r][k] for r in survivors}
    codes = sorted({rec.code for rec in errors.values()})
    if codes == ["E_NOT_SUPPORT"]:
        return Verdict("skipped", errors[survivors[0]].message)
    pressed = codes == PRESSURE_CODES and any(e["kind"] == "hbm_pressure" for e in entries)
    if len(codes) > 1 and not pressed:
        return Verdict("WRONG", f"ranks disagree on the error: codes {', '.join(codes)}")
    for r in survivors:
        problem = _error_problem(sc, r, errors[r], config, dead)
        if problem:
            return Verdict("WRONG", problem)
    return Verdict("clean error", errors[survivors[0]].message)


def _twin_problem(sc, twin, reference):
    for r, recs in enumerate(twin):
        if recs is None or len(recs) != sc.call.calls or not all(rec.ok for rec in recs):
            bad = next((rec for rec in recs or () if not rec.ok), None)
            return f"the fault-free twin failed on rank {r}: {bad.code + ' ' + bad.message if bad else recs}"
        if reference is not None and any(rec.digest != reference[r] for rec in recs):
            return f"the fault-free twin's result on rank {r} differs from the numpy reference"
    return None


def _recovered(sc, twin, faulty, survivors, config) -> Verdict:
    params = dict(config.retry_params)
    retries, bound_ns = 0, 0
    for k in range(sc.call.calls):
        tries = {faulty[r][k].retries for r in survivors}
        if len(tries) > 1:
            return Verdict("WRONG", f"call {k}: ranks disagree on retries ({sorted(tries)})")
        n = tries.pop()
        if n > params["MaxCnt"]:
            return Verdict("WRONG", f"call {k}: {n} retries, over MaxCnt={params['MaxCnt']}")
        if n:
            bound_ns += (n * params["HoldTime"] + (n - 1) * params["IntervalTime"]) * 1_000_000
        retries += n
    if retries:
        if not any(e["kind"] in LINK_FAILING for e in sc.plan.entries):
            return Verdict("WRONG", f"{retries} op retries, but no fault of the plan takes a link down")
        if sc.call.out == "inplace":
            return Verdict("WRONG", "an in-place op (out=x) was retried: HCCL refuses that")
        if not any(on for _, on in config.retry_enable):
            return Verdict("WRONG", f"{retries} op retries with HCCL_OP_RETRY_ENABLE off at every level")
    lost = max(faulty[r][-1].end - twin[r][-1].end for r in survivors)
    if lost < 0:
        return Verdict("WRONG", f"finished {-lost} ns before the fault-free twin")
    if lost < bound_ns:
        return Verdict("WRONG", f"{retries} retries lost {lost} ns, less than HoldTime/IntervalTime make ({bound_ns} ns)")
    interval, count = sc.rdma
    return Verdict("recovered", "", retries, lost / 1e9, bound_ns / 1e9, retries * (count + 1) * interval / 1e9)


def _error_problem(sc, rank, rec, config, dead) -> Optional[str]:
    return error_problem(sc.plan.entries, rank, rec, config, dead, sc.call.out == "inplace")


def error_problem(entries, rank, rec, config, dead, in_place=None) -> Optional[str]:
    """Why rank's error (`rec`: its code, message, fields as `error` and clock as `end`) is not one
    a plan of `entries` can produce (None if it is), from the error's fields: the entry it names,
    its cause, level, peers and details. `dead`: the ranks the plan killed; `in_place`: whether
    the failed call was in place (out=x), which decides an op retry's refusal (None: unknown, not
    checked)."""
    fields = rec.error or {}
    detail = fields.get("detail") or {}
    named = [e for i, e in enumerate(entries) if fields.get("fault") == entry_label(i, e)]
    if not named and _late_behind_slow_links(entries, rec, fields, detail, config):
        return None
    if not named:
        return f"rank {rank}: {rec.code} does not name a fault of the plan: {short(rec.message)}"
    entry = named[0]
    kind = entry["kind"]
    cause = fields.get("cause")
    if kind == "corrupt" and not any(e["kind"] in LINK_FAILING for e in entries):
        return f"rank {rank}: a corrupted transfer alone is retransmitted, yet it got {rec.code}: {short(rec.message)}"
    if kind in CQE_KINDS:
        if rec.code not in CQE_CAUSES:
            return f"rank {rank}: {kind} gave {rec.code}, expected E_REMOTE or E_OPRETRY_FAIL: {short(rec.message)}"
        if cause != CQE_CAUSES[rec.code]:
            return f"rank {rank}: {rec.code} from {kind} has cause {cause}, expected {CQE_CAUSES[rec.code]}"
        level = fields.get("level")
        if level is None or fields.get("link") is None:
            return f"rank {rank}: {rec.code} names no failed link and level: {short(rec.message)}"
        enabled = dict(config.retry_enable).get(level, False)
        if rec.code == "E_REMOTE" and enabled:
            return f"rank {rank}: E_REMOTE although op retry is on for {level}: {short(rec.message)}"
        if rec.code == "E_OPRETRY_FAIL":
            if not enabled:
                return f"rank {rank}: E_OPRETRY_FAIL although op retry is off for {level}"
            if in_place is not None and (detail.get("refused") == "in-place") != in_place:
                return (f"rank {rank}: the refusal does not match the call's out= mode "
                        f"({'out=x' if in_place else 'not in place'}): {short(rec.message)}")
            cap = dict(config.retry_params)["MaxCnt"]
            if detail.get("max_cnt") != cap:
                return f"rank {rank}: refusal names MaxCnt={detail.get('max_cnt')}, the environment set {cap}"
            if detail.get("refused") == "exhausted" and detail.get("tries") != cap:
                return f"rank {rank}: retries exhausted after {detail.get('tries')} tries, MaxCnt={cap}"
        return None
    if kind == "rank_crash":
        if rec.code != "E_TIMEOUT" or cause != Cause.RANK_LOST:
            return f"rank {rank}: a lost rank gave {rec.code} ({cause}), expected E_TIMEOUT: {short(rec.message)}"
        if entry["rank"] not in dead:
            return f"rank {rank}: told rank {entry['rank']} was lost, but rank {entry['rank']} did not die"
        if entry["rank"] not in (fields.get("peers") or ()):
            return f"rank {rank}: the E_TIMEOUT does not name rank {entry['rank']}"
        wait = HEARTBEAT_LOST_S if not config.exec_timeout_s else min(HEARTBEAT_LOST_S, config.exec_timeout_s)
        how = "heartbeat" if wait == HEARTBEAT_LOST_S else "HCCL_EXEC_TIMEOUT"
        if detail.get("detected_by") != how:
            return f"rank {rank}: expected detection by {how} (wait {wait} s): {short(rec.message)}"
        crashed = detail.get("crashed_ns")
        if crashed is None or rec.end < crashed + seconds_to_ns(wait):
            return (f"rank {rank}: told at {rec.end / 1e9:.6f} s, before the {wait} s wait since the crash "
                    f"({'unknown' if crashed is None else f'{crashed / 1e9:.6f} s'}) was over")
        return None
    if kind == "rank_stall":
        if rec.code != "E_TIMEOUT" or cause != Cause.TIMEOUT or not detail.get("stalled"):
            return f"rank {rank}: a stalled rank gave {rec.code} ({cause}), expected E_TIMEOUT: {short(rec.message)}"
        if detail.get("slow") != entry["rank"] or entry["rank"] not in dead:
            return f"rank {rank}: E_TIMEOUT names rank {detail.get('slow')}, the plan stalls rank {entry['rank']}"
        return None
    if kind == "hbm_pressure":
        return _pressure_problem(entry, rank, rec, cause, fields, detail, config)
    if kind == "straggler":
        if rec.code != "E_TIMEOUT" or cause != Cause.TIMEOUT:
            return f"rank {rank}: a slow rank gave {rec.code} ({cause}), expected E_TIMEOUT: {short(rec.message)}"
        late, timeout = detail.get("late_ns"), config.exec_timeout_s
        if detail.get("slow") != entry["rank"] or not timeout or late is None or late <= seconds_to_ns(timeout):
            return (f"rank {rank}: E_TIMEOUT names rank {detail.get('slow')} late by {late} ns, but the plan's straggler "
                    f"is rank {entry['rank']} and HCCL_EXEC_TIMEOUT is {timeout} s: {short(rec.message)}")
        return None
    return f"rank {rank}: a {kind} fault cannot fail an op, yet it got {rec.code}: {short(rec.message)}"


def _pressure_problem(entry, rank, rec, cause, fields, detail, config) -> Optional[str]:
    """Why an error naming an hbm_pressure entry is not one it makes (None if it is): E_MEMORY on
    the pressured rank (a starved link setup, or an allocation that did not fit beside it), or
    E_TIMEOUT on a peer of it whose link setup (or new communicator's init) waited out
    HCCL_CONNECT_TIMEOUT + 20 s for it."""
    if rec.code == "E_MEMORY":
        if cause != Cause.NO_MEMORY or not detail.get("no_memory"):
            return f"rank {rank}: E_MEMORY from hbm_pressure has cause {cause}, expected NO_MEMORY: {short(rec.message)}"
        if rank != entry["rank"]:
            return f"rank {rank}: E_MEMORY names the hbm_pressure of rank {entry['rank']}: {short(rec.message)}"
        return None
    if rec.code != "E_TIMEOUT" or cause != Cause.TIMEOUT or not (detail.get("link_setup") or detail.get("comm_init")):
        return (f"rank {rank}: an hbm_pressure gave {rec.code} ({cause}), expected E_MEMORY on its rank or a link "
                f"setup's E_TIMEOUT: {short(rec.message)}")
    limit = config.connect_timeout_s + CONNECT_GRACE_S
    if detail.get("connect_timeout_s") != limit or not fields.get("peers") or rank == entry["rank"]:
        return (f"rank {rank}: the link setup's E_TIMEOUT names peers {fields.get('peers')} after "
                f"{detail.get('connect_timeout_s')} s; expected a peer of rank {entry['rank']} after {limit} s "
                f"(HCCL_CONNECT_TIMEOUT + {CONNECT_GRACE_S}): {short(rec.message)}")
    if rec.end - rec.start < seconds_to_ns(limit):
        return f"rank {rank}: told {(rec.end - rec.start) / 1e9:.6f} s after its call began, before {limit} s"
    return None


def _late_behind_slow_links(entries, rec, fields, detail, config) -> bool:
    """Whether the error is a later op's timeout behind a peer that the plan's faults held up: a
    transfer retransmitted until its link came back (or slowed) kept that rank in an op while the
    others went on, or a starved link setup kept the pressured rank's peers waiting out their
    connect timeout, and its next op then began past their HCCL_EXEC_TIMEOUT. It names no entry
    (the slow rank's lateness is its last op's); it is only possible with such faults."""
    timeout = config.exec_timeout_s
    return (rec.code == "E_TIMEOUT" and fields.get("cause") == Cause.TIMEOUT and fields.get("fault") is None
            and detail.get("late_ns") is not None and bool(timeout) and detail["late_ns"] > seconds_to_ns(timeout)
            and any(e["kind"] in HOLDING_UP for e in entries))


def short(text: str, n: int = 240) -> str:
    text = " ".join(text.split())
    return text if len(text) <= n else text[:n - 3] + "..."


@dataclass
class Result:
    """A scenario's outcome, as reported."""
    index: int
    verdict: Verdict
    wall_s: float                      # the twin and the faulty run, together
    twin: Optional[list] = None        # every rank's CallRecords
    faulty: Optional[list] = None

    @property
    def outcome(self) -> str:
        return self.verdict.outcome
