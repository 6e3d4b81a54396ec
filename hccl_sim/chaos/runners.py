"""Running chaos scenarios: on the local engine (hccl_sim.run per run) or on one Ray cluster for
the whole campaign (Cluster.run with each scenario's plan and environment), each run in a thread
of its own with a wall deadline (HANG), and what a scenario leaves behind (LEAK): shared memory,
processes, threads, device allocations.
"""
from __future__ import annotations

import dataclasses
import os
import re
import threading
import time
import warnings

from topologies.errors import HcclError

from ..engines import registry
from ..config.env import Config
from .check import Result, Verdict, classify, rank_program, reference_digests, short
from .scenarios import Scenario

DEADLINE_MARGIN_S = 15
"""A run's wall deadline is at least HCCL_EXEC_TIMEOUT + this: the engines' own deadline on every
wait (HCCL_EXEC_TIMEOUT, in wall seconds) must have had its chance before a run counts as hung."""


class LocalRunner:
    """Scenarios on the local engine: hccl_sim.run per run."""
    engine = "local"

    def __init__(self, topo):
        self.topo = topo

    def run(self, call, env, plan):
        from .. import run
        return run(rank_program, topology=self.topo, env=env, faults=plan, args=(call,))

    def crash_supported(self) -> bool:
        return True

    def after_hang(self):
        pass             # a hung run's threads are daemons, and the next snapshot includes them

    def kept(self, names) -> set:
        """Shared-memory entries the engine keeps between runs by design: none in-process."""
        return set()

    def close(self) -> list:
        return []


class RayRunner:
    """Scenarios on the Ray engine: one Cluster (its actors) for the whole campaign, each run
    with the scenario's environment and fault plan (Cluster.run(faults=, env=))."""
    engine = "ray"

    def __init__(self, topo, address=None):
        from .. import Cluster
        self.topo, self.address = topo, address
        self.cluster = Cluster(topo, engine="ray", address=address)

    def run(self, call, env, plan):
        from ..faults.fault_plan import FaultPlan
        return self.cluster.run(rank_program, args=(call,), env=env, faults=FaultPlan() if plan is None else plan)

    def crash_supported(self) -> bool:
        """Whether this engine runs rank_crash (found by trying: a plan whose crash never comes)."""
        from ..faults.fault_plan import FaultPlan
        try:
            self.cluster.run(_no_op, faults=FaultPlan().rank_crash(0, at_op=1 << 30), env={})
        except HcclError as exc:
            if exc.code == "E_NOT_SUPPORT":
                return False
            raise
        return True

    def after_hang(self):
        """A run that never ended leaves its actors busy: start a fresh set."""
        from .. import Cluster
        closer = threading.Thread(target=self.cluster.close, daemon=True)
        closer.start()
        closer.join(60)
        self.cluster = Cluster(self.topo, engine="ray", address=self.address)

    def kept(self, names) -> set:
        """The actors' working set between runs (hcomm.memory.segment_provider): per rank its newest
        CCL input, output and scratch segment and RESULT_POOL_SPARE pooled results, plus the results
        of the last run's calls (held until it returned: the pool trims at its next allocation);
        anything beyond that (an old generation, a device allocation, a pool that keeps growing) is
        left behind."""
        from hcomm.memory.segments import PREFIX
        from hcomm.memory.segment_provider import RESULT_POOL_SPARE
        from .scenarios import MAX_CALLS
        stem = f"{PREFIX}{self.cluster.session}_"
        by_rank = {}
        for name in names:
            parts = name[len(stem):].split("_") if name.startswith(stem) else []
            if len(parts) >= 3 and parts[-1].isdigit():      # rank, kind, [pid,] generation or counter
                by_rank.setdefault((parts[0], parts[1]), []).append((int(parts[-1]), name))
        kept = set()
        for (rank, kind), found in by_rank.items():
            keep = {"input": 1, "output": 1, "scratch": 1, "result": RESULT_POOL_SPARE + MAX_CALLS}.get(kind, 0)
            kept |= {name for _, name in sorted(found)[max(0, len(found) - keep):]} if keep else set()
        return kept

    def close(self) -> list:
        """Close the cluster; what it left behind (segments of its session, live actor processes)."""
        from hcomm.memory import segments as shm
        session, pids = self.cluster.session, self.cluster.pids
        self.cluster.close()
        deadline = time.monotonic() + 10
        while True:
            left = [path for path in shm.leftovers(session)] + [f"rank actor process {pid}" for pid in pids
                                                                  if _alive(pid)]
            if not left or time.monotonic() >= deadline:
                return left
            time.sleep(0.1)


def _alive(pid) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def _no_op(comm):
    return None


def runner_for(engine: str, topo, address=None):
    """The runner of a campaign on `engine` (the registry's engines that offer chaos)."""
    eng = registry.get(engine, "chaos", "chaos")
    return LocalRunner(topo) if eng.in_process else RayRunner(topo, address)


def run_scenario(sc: Scenario, runner, deadline_s: float = 60.0, margin_s: float = DEADLINE_MARGIN_S) -> Result:
    """The scenario's twin, then the scenario, each within the wall deadline (at least
    HCCL_EXEC_TIMEOUT + `margin_s`); classified, and checked for anything left behind."""
    limit = max(deadline_s, Config.from_env(sc.env).exec_timeout_s + margin_s)
    before = snapshot()
    t0 = time.perf_counter()
    reference = reference_digests(sc.call, runner.topo.num_ranks)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ResourceWarning)
        twin = bounded(lambda: runner.run(sc.call, sc.env, None), limit)
        faulty = bounded(lambda: runner.run(sc.call, sc.env, sc.plan), limit) if twin[0] == "done" else twin
    wall = time.perf_counter() - t0
    if "hang" in (twin[0], faulty[0]):
        which = "fault-free twin" if twin[0] == "hang" else "scenario"
        runner.after_hang()
        return Result(sc.index, Verdict("HANG", f"the {which} did not finish within {limit:g} s of wall time"), wall)
    if "raised" in (twin[0], faulty[0]):
        exc = twin[1] if twin[0] == "raised" else faulty[1]
        outcome = "skipped" if isinstance(exc, HcclError) and exc.code == "E_NOT_SUPPORT" else "WRONG"
        verdict = Verdict(outcome, f"the {'twin' if twin[0] == 'raised' else 'scenario'} raised: "
                                   f"{short(f'{type(exc).__name__}: {exc}', 2000)}")
    else:
        verdict = classify(sc, twin[1], faulty[1], reference)
    left = leaks(before, kept=runner.kept) + [str(w.message) for w in caught if issubclass(w.category, ResourceWarning)]
    if left:
        if verdict.outcome == "WRONG":
            verdict.detail += f"; also left behind: {', '.join(left[:4])}"
        else:
            verdict = dataclasses.replace(verdict, outcome="LEAK", detail=f"left behind: {', '.join(left[:4])}"
                                          + (" ..." if len(left) > 4 else ""))
    return Result(sc.index, verdict, wall, twin[1] if twin[0] == "done" else None,
                  faulty[1] if faulty[0] == "done" else None)


def bounded(fn, limit_s: float):
    """("done", value), ("raised", exception) or ("hang", None): fn run in a thread of its own,
    waited for `limit_s` wall seconds."""
    box = {}

    def body():
        try:
            box["value"] = fn()
        except BaseException as exc:   # noqa: BLE001 - reported as the scenario's outcome
            box["error"] = exc
    worker = threading.Thread(target=body, name="hccl-chaos-run", daemon=True)
    worker.start()
    worker.join(limit_s)
    if worker.is_alive():
        return ("hang", None)
    if "error" in box:
        return ("raised", box["error"])
    return ("done", box["value"])


# ---- what a scenario leaves behind ---------------------------------------------------------------

def snapshot():
    """(/dev/shm entries, descendant processes, hccl-sim threads) now."""
    return (_shm_entries(), descendants(), {t.ident for t in threading.enumerate() if t.name.startswith("hccl-")})


def leaks(before, settle_s: float = 2.0, kept=None) -> list:
    """What is there now and was not in `before` (waiting up to `settle_s` for it to go): shared
    memory named for a process of this tree (hccl-sim's segments carry the driver's pid; entries of
    other users of the machine are not ours to count) beyond what `kept(names)` says the engine
    keeps by design, processes below this one (but Ray's and resource trackers, _by_design), live
    rank or data-plane threads."""
    deadline = time.monotonic() + settle_s
    while True:
        shm, procs, threads = snapshot()
        ours = procs | {os.getpid()}
        allowed = kept(shm) if kept is not None else set()
        left = [f"/dev/shm/{n}" for n in sorted(shm - before[0] - allowed) if _pid_in(n) in ours]
        left += [f"process {pid} ({_cmdline(pid)[:60]})" for pid in sorted(procs - before[1]) if not _by_design(pid)]
        left += [f"thread {t.name}" for t in threading.enumerate() if t.ident in threads - before[2]]
        if not left or time.monotonic() >= deadline:
            return left
        time.sleep(0.05)


def _by_design(pid) -> bool:
    """Ray's own processes (it starts and stops workers as it likes) and multiprocessing's resource
    tracker (one per process that made shared memory, living as long as that process)."""
    cmd = _cmdline(pid)
    return "ray" in cmd.lower() or "resource_tracker" in cmd


def _shm_entries() -> set:
    try:
        return set(os.listdir("/dev/shm"))
    except OSError:
        return set()


def _pid_in(name: str):
    m = re.search(r"-(\d+)-", name)
    return int(m.group(1)) if m else None


def descendants() -> set:
    """Live (not zombie) processes below this one, from /proc."""
    parent = {}
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                with open(f"/proc/{pid}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
                if fields[0] != "Z":
                    parent[int(pid)] = int(fields[1])
            except (OSError, IndexError):
                pass
    found, frontier = set(), {os.getpid()}
    while frontier:
        frontier = {pid for pid, pp in parent.items() if pp in frontier} - found
        found |= frontier
    return found


def _cmdline(pid) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return "?"
