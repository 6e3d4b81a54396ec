"""A chaos campaign end to end: scenarios generated and run one by one, the table, the summary by
outcome, the JSON of every scenario, and one scenario in full (`--replay N`)."""
from __future__ import annotations

import json
import statistics
import sys
from dataclasses import dataclass

import yaml

from .check import FAILURES, OUTCOMES
from .runners import run_scenario, runner_for
from .makers import fmt_s
from .scenarios import quiet_logs, scenario, space_for, unmade_kinds


@dataclass
class Campaign:
    space: object                 # what the scenarios were drawn from (scenarios.Space)
    results: list                 # [(Scenario, Result), ...]
    left: list                    # what the engine left behind once closed (segments, processes)

    def __iter__(self):           # space, results, left = run_campaign(...)
        return iter((self.space, self.results, self.left))


def run_campaign(seed: int, n: int, topo, engine: str = "local", deadline_s: float = 60.0, only=None,
                 address=None, on_start=None, on_result=None) -> Campaign:
    """Scenarios 0..n-1 (or only scenario `only`) run one by one on one engine, which is checked
    once closed. `on_start(space, total)` once the engine is up; `on_result(scenario, result)` after each."""
    runner = runner_for(engine, topo, address)
    out, space = [], None
    try:
        space = space_for(topo, crash_ok=runner.crash_supported())
        indices = [only] if only is not None else list(range(n))
        if on_start:
            on_start(space, len(indices))
        with quiet_logs():
            for i in indices:
                sc = scenario(seed, i, topo, space)
                result = run_scenario(sc, runner, deadline_s)
                out.append((sc, result))
                if on_result:
                    on_result(sc, result)
    finally:
        left = runner.close()
    return Campaign(space, out, left)


def failed(results, left=()) -> bool:
    return bool(left) or any(r.outcome in FAILURES for _, r in results)


# ---- the table ------------------------------------------------------------------------------------

def header(seed, n, topo, engine, space, table: bool = True) -> str:
    lines = [f"# hccl-sim chaos: {n} scenario{'s' if n != 1 else ''}, seed {seed}, on {topo.name} "
             f"({topo.num_servers} server{'s' if topo.num_servers != 1 else ''}, {topo.num_ranks} ranks, "
             f"{topo.device}), engine {engine}",
             f"# fault kinds: {', '.join(space.kinds)}; retry levels: {', '.join(space.levels)}"]
    missing = unmade_kinds()
    if missing:
        lines.append(f"# modelled but not generated yet: {', '.join(missing)}")
    from ..faults.fault_plan import KINDS, MODELLED
    off = [k for k in KINDS if k in MODELLED and k not in space.kinds and k not in missing]
    if off:
        lines.append(f"# not drawn here: {', '.join(off)} (not runnable on this topology or engine)")
    lines.append("# each scenario runs against its fault-free twin (same data, call and environment); lost = "
                 "simulated time over the twin's (last exit, max over ranks); wall = both runs")
    if table:
        lines.append(f"# {'scenario':>8s}  {'outcome':<11s} {'retries':>7s} {'lost':>9s} {'wall':>8s}  fault  |  call")
    return "\n".join(lines)


def row(sc, result) -> str:
    v = result.verdict
    retries = "-" if v.retries is None else str(v.retries)
    lost = "-" if v.lost_s is None else fmt_s(v.lost_s)
    line = (f"{sc.index:10d}  {v.outcome:<11s} {retries:>7s} {lost:>9s} {result.wall_s * 1e3:6.0f}ms  "
            f"{sc.fault}  |  {sc.call.describe()}")
    if v.outcome in FAILURES + ("skipped",):
        line += f"\n{'':12s}{v.outcome}: {v.detail}"
    return line


def summary(results) -> dict:
    counts = {o: 0 for o in OUTCOMES}
    for _, r in results:
        counts[r.outcome] += 1
    walls = [r.wall_s for _, r in results]
    retried = [r.verdict for _, r in results if r.outcome == "recovered" and r.verdict.retries]
    out = {"scenarios": len(results), "outcomes": counts,
           "wall_s": {"median": statistics.median(walls) if walls else 0.0, "max": max(walls, default=0.0)},
           "retried_scenarios": len(retried), "retries": sum(v.retries for v in retried)}
    if retried:
        per_retry = [v.lost_s / v.retries for v in retried]
        rest = [(v.lost_s - v.bound_s) / v.cqe_s for v in retried if v.cqe_s]
        out["lost_per_retry_s"] = {"median": statistics.median(per_retry), "max": max(per_retry)}
        out["hold_interval_per_retry_s"] = {"median": statistics.median(v.bound_s / v.retries for v in retried)}
        out["rest_over_cqe_budget"] = ({"min": min(rest), "median": statistics.median(rest), "max": max(rest)}
                                       if rest else None)
    return out


def format_summary(results, left=()) -> str:
    s = summary(results)
    c = s["outcomes"]
    lines = [f"# {s['scenarios']} scenarios: " + ", ".join(f"{o} {c[o]}" for o in OUTCOMES),
             f"# wall per scenario: median {s['wall_s']['median'] * 1e3:.0f} ms, max {s['wall_s']['max'] * 1e3:.0f} ms"]
    if s["retried_scenarios"]:
        lost, hold = s["lost_per_retry_s"], s["hold_interval_per_retry_s"]
        lines.append(f"# {s['retried_scenarios']} recovered by op retry ({s['retries']} retries): simulated time lost "
                     f"per retry median {fmt_s(lost['median'])}, max {fmt_s(lost['max'])}, of which HoldTime + "
                     f"IntervalTime median {fmt_s(hold['median'])}")
        rest = s["rest_over_cqe_budget"]
        if rest:
            lines.append(f"#   the rest is each failed try up to its error CQE: {rest['min']:.3g}x to {rest['max']:.3g}x "
                         f"(median {rest['median']:.3g}x) the retransmission budget (HCCL_RDMA_RETRY_CNT + 1) x "
                         "4.096 us x 2^HCCL_RDMA_TIMEOUT")
    if left:
        lines.append(f"# LEAK once the engine closed: {', '.join(left[:6])}" + (" ..." if len(left) > 6 else ""))
    bad = sum(c[o] for o in FAILURES) + bool(left)
    lines.append(f"# {'FAILED: ' + str(bad) + ' WRONG/HANG/LEAK' if bad else 'OK: no WRONG, HANG or LEAK'}")
    return "\n".join(lines)


# ---- one scenario in full ---------------------------------------------------------------------------

def replay_text(sc, result) -> str:
    v = result.verdict
    lines = [f"# scenario {sc.index} of seed {sc.seed}: {sc.fault}",
             f"call: {sc.call.describe()}",
             f"call fields: {sc.call.to_dict()}",
             f"fault aimed at call {sc.target}; the twin's planned spans (ns): {list(sc.spans)}",
             "env:" + "".join(f"\n  {k}={v_}" for k, v_ in sorted(sc.env.items())),
             "plan (YAML):", _indent(yaml.safe_dump(sc.plan.to_dict(), sort_keys=False).rstrip()),
             f"outcome: {v.outcome}" + (f": {v.detail}" if v.detail else "")]
    if v.retries is not None:
        lines.append(f"retries {v.retries}, simulated time lost {fmt_s(v.lost_s)} (at least {fmt_s(v.bound_s)} "
                     "from HoldTime/IntervalTime)")
    lines.append(f"wall {result.wall_s * 1e3:.0f} ms")
    for title, ranks in (("fault-free twin", result.twin), ("under the fault plan", result.faulty)):
        lines.append(f"{title}:")
        if ranks is None:
            lines.append("  (did not complete)")
            continue
        for r, recs in enumerate(ranks):
            if recs is None:
                lines.append(f"  rank {r}: dead (None)")
                continue
            for k, rec in enumerate(recs):
                if rec.ok:
                    what = f"ok {rec.digest} [{rec.start}, {rec.end}] ns retries {rec.retries} algo {rec.algo}"
                else:
                    what = f"{rec.code} at {rec.end} ns: {rec.message}"
                lines.append(f"  rank {r} call {k}: {what}")
    return "\n".join(lines)


def _indent(text, pad="  "):
    return "\n".join(pad + line for line in text.splitlines())


# ---- JSON -----------------------------------------------------------------------------------------

def to_json(seed, topo, engine, space, results, left=()) -> dict:
    return {"seed": seed, "topology": topo.name, "ranks": topo.num_ranks, "servers": topo.num_servers,
            "engine": engine, "kinds": list(space.kinds), "summary": summary(results), "left_at_close": list(left),
            "scenarios": [_scenario_json(sc, r) for sc, r in results]}


def _scenario_json(sc, result) -> dict:
    v = result.verdict
    d = sc.to_dict()
    d.update({"outcome": v.outcome, "detail": v.detail, "retries": v.retries, "lost_s": v.lost_s,
              "retry_bound_s": v.bound_s, "wall_s": result.wall_s,
              "twin_exit_ns": _exits(result.twin), "exit_ns": _exits(result.faulty),
              "ranks": _rank_outcomes(result.faulty)})
    return d


def _exits(ranks):
    if ranks is None:
        return None
    return [None if recs is None else [rec.end for rec in recs] for recs in ranks]


def _rank_outcomes(ranks):
    if ranks is None:
        return None
    return [None if recs is None else [rec._asdict() for rec in recs] for recs in ranks]


def write_json(path, seed, topo, engine, space, results, left=()) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump(to_json(seed, topo, engine, space, results, left), f, indent=1)


def progress_bar(total: int):
    """A tqdm bar on stderr, or None when stderr is not a terminal (logs and pipes get the table only)."""
    if not sys.stderr.isatty():
        return None
    from tqdm import tqdm
    return tqdm(total=total, file=sys.stderr, unit="scenario", dynamic_ncols=True, leave=False)
