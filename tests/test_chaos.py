"""`hccl-sim chaos`: seeded fault campaigns. A campaign of 100+ scenarios on the local engine with no
WRONG, HANG or LEAK; the same seed, the same scenarios and outcomes; every outcome class reached
and told apart (results that differ, ranks that disagree, codes or messages that do not fit the
fault, runs that never end, segments and threads left behind, scenarios an engine refuses);
--replay and --json through the CLI; bad arguments exit 2."""
import dataclasses
import json
import os
import threading

import numpy as np
import pytest

import hccl_sim
import topologies
from hccl_sim import FaultPlan, HcclError
from hccl_sim.chaos import Call, Scenario, classify, generate, run_campaign, run_scenario, scenario
from hccl_sim.chaos.scenarios import OPS as CHAOS_OPS
from hccl_sim.chaos import report
from hccl_sim.chaos.check import Result, Verdict, reference_digests
from hccl_sim.chaos.runners import LocalRunner
from hccl_sim.chaos.scenarios import rdma_budget, twin_spans
from hccl_sim.tools.cli import main

FAST = {"HCCL_RDMA_TIMEOUT": "5", "HCCL_RDMA_RETRY_CNT": "1", "HCCL_EXEC_TIMEOUT": "10"}
INTERVAL_NS = round(4.096e-6 * 2 ** 5 * 1e9)     # one retransmission at HCCL_RDMA_TIMEOUT=5


@pytest.fixture(scope="module")
def a2():
    """Two 910B servers of four NPUs: links inside a server (L0) and between servers (L1)."""
    return topologies.hardware("atlas800t-a2", devices_per_server=[4, 4])


def hand_made(topo, call, env, plan, target=0):
    return Scenario(0, 0, call, dict(env), plan, "hand-made", target, tuple(twin_spans(call, env, topo)),
                    rdma_budget(topo, env))


def allreduce(count=3000, calls=1, out="new"):
    return Call("allreduce", count, "int64", "sum", None, None, out, calls, data_seed=12)


def run(topo, sc):
    return run_scenario(sc, LocalRunner(topo))


@pytest.mark.campaign
def test_campaign_of_100_scenarios_on_the_local_engine(a2):
    """Every scenario is recovered or a clean error, every fault kind and collective turns up, and
    each fault's time lands inside the call it aims at (the twin's real clocks are the planned spans)."""
    space, results, left = run_campaign(7, 100, a2)
    outcomes = {r.outcome for _, r in results}
    assert left == [] and not report.failed(results), [(sc.index, r.outcome, r.verdict.detail) for sc, r in results
                                        if r.outcome in report.FAILURES]
    assert outcomes == {"recovered", "clean error"}
    drawn = {e["kind"] for sc, _ in results for e in sc.plan.entries}
    assert drawn == set(space.kinds) == set(hccl_sim.faults.fault_plan.MODELLED)      # a newly modelled kind needs a maker
    assert any(r.verdict.retries for _, r in results)           # some ops recovered by op retry
    assert {sc.call.op for sc, _ in results} == set(CHAOS_OPS)          # the variable-size ops too
    for sc, r in results:
        for k, (lo, hi) in enumerate(sc.spans):
            assert max(recs[k].end for recs in r.twin) == hi and min(recs[k].start for recs in r.twin) == lo
        for e in sc.plan.entries:
            if e.get("at") and e["kind"] != "link_slow":
                lo, hi = sc.spans[sc.target]
                assert lo <= round(e["at"] * 1e9) < hi, (sc.index, e)
    summary = report.summary(results)
    assert summary["rest_over_cqe_budget"]["min"] >= 1.0     # every failed try ran its retransmissions out


@pytest.mark.campaign
def test_seed_fixes_scenarios_and_campaign_outcomes_a_new_seed_changes_them_scenario_n_replays_alone(a2):
    first = [sc.to_dict() for sc in generate(5, 40, a2)]
    assert first == [sc.to_dict() for sc in generate(5, 40, a2)]
    assert first != [sc.to_dict() for sc in generate(6, 40, a2)]
    assert scenario(5, 17, a2).to_dict() == first[17]            # scenario N alone, as --replay draws it

    def outcomes():
        _, results, _ = run_campaign(5, 8, a2)
        return [(r.outcome, r.verdict.detail, r.verdict.retries, r.verdict.lost_s, r.twin, r.faulty)
                for _, r in results]
    assert outcomes() == outcomes()


# ---- each outcome, reached and detected ------------------------------------------------------------

@pytest.mark.local
def test_a_flap_inside_one_retransmission_interval_is_absorbed(a2):
    """A flap of the RoCE link 0-4 over the whole op, shorter than one retransmission interval:
    every transfer over it gets through on its first retransmission; no op retry, time lost."""
    plan = FaultPlan().link_flap(0, 4, at=0.0, duration=INTERVAL_NS / 2 / 1e9)
    got = run(a2, hand_made(a2, allreduce(), FAST, plan))
    assert got.outcome == "recovered" and got.verdict.retries == 0 and got.verdict.lost_s > 0


@pytest.mark.local
def test_op_retry_recovers_bit_identical_and_loses_at_least_hold_time(a2):
    env = {**FAST, "HCCL_OP_RETRY_ENABLE": "L0:0,L1:1", "HCCL_OP_RETRY_PARAMS": "MaxCnt:3,HoldTime:5,IntervalTime:2"}
    plan = FaultPlan().link_flap(0, 4, at=0.0, duration=8e-3)
    got = run(a2, hand_made(a2, allreduce(calls=2), env, plan))
    v = got.verdict
    assert got.outcome == "recovered" and v.retries == 2 and v.bound_s == pytest.approx(0.012)
    # each failed try ran its retransmissions out: (RETRY_CNT + 1) intervals to its error CQE
    assert v.cqe_s == 2 * 2 * INTERVAL_NS / 1e9 and v.lost_s >= v.bound_s + v.cqe_s
    assert [rec.retries for rec in got.faulty[3]] == [2, 0]


@pytest.mark.local
def test_a_straggler_costs_exactly_its_delay(a2):
    plan = FaultPlan().straggler(5, delay=1e-3)
    got = run(a2, hand_made(a2, allreduce(), FAST, plan))
    assert got.outcome == "recovered" and got.verdict.lost_s == pytest.approx(1e-3, abs=1e-9)


@pytest.mark.local
def test_clean_errors_link_down_in_place_and_lost_rank(a2):
    down = run(a2, hand_made(a2, allreduce(), FAST, FaultPlan().link_down(1, 6)))
    assert down.outcome == "clean error" and "E_REMOTE" in down.verdict.detail
    retry = {**FAST, "HCCL_OP_RETRY_ENABLE": "L1:1"}
    inplace = run(a2, hand_made(a2, allreduce(out="inplace"), retry, FaultPlan().link_down(1, 6)))
    assert inplace.outcome == "clean error" and "cannot retry an in-place op" in inplace.verdict.detail
    crash = run(a2, hand_made(a2, allreduce(calls=2), FAST, FaultPlan().rank_crash(2, at_op=1), target=1))
    assert crash.outcome == "clean error" and "notify wait timed out (HCCL_EXEC_TIMEOUT)" in crash.verdict.detail
    assert crash.faulty[2] is None and all(recs[0].ok for r, recs in enumerate(crash.faulty) if r != 2)


def _records(topo, sc):
    runner = LocalRunner(topo)
    return runner.run(sc.call, sc.env, None), runner.run(sc.call, sc.env, sc.plan)


@pytest.mark.local
def test_classify_tells_wrong_from_right(a2):
    sc = hand_made(a2, allreduce(calls=2), FAST, FaultPlan().straggler(3, delay=2e-4))
    twin, faulty = _records(a2, sc)
    reference = reference_digests(sc.call, a2.num_ranks)
    assert classify(sc, twin, faulty, reference).outcome == "recovered"
    changed = [list(recs) for recs in faulty]
    changed[6][1] = changed[6][1]._replace(digest="int64[3000]:0000")
    v = classify(sc, twin, changed, reference)
    assert v.outcome == "WRONG" and "rank 6 call 1: result int64[3000]:0000 differs from the fault-free twin's" in v.detail
    assert "differs from the numpy reference" in classify(sc, changed, faulty, reference).detail
    failing = [list(recs) for recs in faulty]
    failing[2][1] = failing[2][1]._replace(ok=False, code="E_REMOTE", message="link down")
    assert "ranks disagree" in classify(sc, twin, failing, reference).detail
    dead = list(faulty)
    dead[4] = None
    assert "rank 4 returned no result, but the plan does not crash it" in classify(sc, twin, dead, reference).detail
    slower = [list(recs) for recs in faulty]
    slower[1][0] = slower[1][0]._replace(retries=1)
    assert "ranks disagree on retries" in classify(sc, twin, slower, reference).detail


@pytest.mark.local
def test_classify_checks_each_error_against_its_fault(a2):
    sc = hand_made(a2, allreduce(), FAST, FaultPlan().link_down(1, 6))
    twin, faulty = _records(a2, sc)
    assert classify(sc, twin, faulty).outcome == "clean error"

    def every(**change):
        return [[recs[0]._replace(**change)] for recs in faulty]
    message = faulty[0][0].message
    assert "ranks disagree on the error" in classify(
        sc, twin, [[recs[0]._replace(code="E_TIMEOUT")] if r == 3 else recs for r, recs in enumerate(faulty)]).detail
    assert "link_down gave E_TIMEOUT" in classify(sc, twin, every(code="E_TIMEOUT")).detail
    # judged by the error's fields, never its text: a message naming nothing changes nothing
    anonymous = message.replace("fault plan entry 0", "something").replace("(L1)", "")
    assert classify(sc, twin, every(message=anonymous)).outcome == "clean error"
    error = faulty[0][0].error
    assert error["cause"] == "LINK_FAILED" and error["level"] == "L1" and error["fault"] in message
    assert "does not name a fault of the plan" in classify(sc, twin, every(error={**error, "fault": None})).detail
    assert "does not name a fault of the plan" in classify(sc, twin, every(error=None)).detail
    assert "names no failed link and level" in classify(sc, twin, every(error={**error, "level": None})).detail
    aborted = every(error={**error, "cause": "ABORTED"})
    assert "has cause ABORTED, expected LINK_FAILED" in classify(sc, twin, aborted).detail
    retry_on = dataclasses.replace(sc, env={**FAST, "HCCL_OP_RETRY_ENABLE": "L1:1"})
    assert "E_REMOTE although op retry is on for L1" in classify(retry_on, twin, faulty).detail
    straggling = dataclasses.replace(sc, plan=FaultPlan().straggler(1, delay=1e-3))
    assert "does not name a fault" in classify(straggling, twin, faulty).detail
    refused = every(code="E_NOT_SUPPORT")
    assert classify(sc, twin, refused).outcome == "skipped"


@pytest.mark.local
def test_classify_judges_lost_ranks_and_refusals_by_their_fields(a2):
    """The lost rank, how and when it was found, the refusal and MaxCnt: read from the error's
    fields (cause, peers, detail), whatever the message says."""
    sc = hand_made(a2, allreduce(calls=2), FAST, FaultPlan().rank_crash(2, at_op=1), target=1)
    twin, faulty = _records(a2, sc)
    assert classify(sc, twin, faulty).outcome == "clean error"

    def changed(**change):
        """Every survivor's error in call 1 with fields changed (a callable: from the fields)."""
        def new(err):
            return {**err, **{k: v(err) if callable(v) else v for k, v in change.items()}}
        return [None if recs is None else [recs[0], recs[1]._replace(error=new(recs[1].error))] for recs in faulty]
    err = faulty[0][1].error
    assert err["cause"] == "RANK_LOST" and err["peers"] == (2,) and err["detail"]["detected_by"] == "HCCL_EXEC_TIMEOUT"
    assert "does not name rank 2" in classify(sc, twin, changed(peers=(5,))).detail
    assert "expected E_TIMEOUT" in classify(sc, twin, changed(cause="TIMEOUT")).detail
    assert "expected detection by HCCL_EXEC_TIMEOUT" in classify(
        sc, twin, changed(detail=lambda e: {**e["detail"], "detected_by": "heartbeat"})).detail
    assert "before the 10 s wait since the crash" in classify(
        sc, twin, changed(detail=lambda e: {**e["detail"], "crashed_ns": e["detail"]["crashed_ns"] + 1})).detail

    retry = {**FAST, "HCCL_OP_RETRY_ENABLE": "L1:1"}
    sc = hand_made(a2, allreduce(out="inplace"), retry, FaultPlan().link_down(1, 6))
    twin, faulty = _records(a2, sc)
    assert classify(sc, twin, faulty).outcome == "clean error"
    err = faulty[0][0].error
    assert err["cause"] == "OPRETRY_FAIL" and err["detail"]["refused"] == "in-place" and err["detail"]["max_cnt"] == 1

    def every(**detail):
        return [[recs[0]._replace(error={**recs[0].error, "detail": {**recs[0].error["detail"], **detail}})]
                for recs in faulty]
    assert "does not match the call's out= mode" in classify(sc, twin, every(refused="exhausted")).detail
    assert "refusal names MaxCnt=4, the environment set 1" in classify(sc, twin, every(max_cnt=4)).detail


class _Blocking(LocalRunner):
    """A runner whose faulty run never returns (until released)."""

    def __init__(self, topo):
        super().__init__(topo)
        self.release = threading.Event()

    def run(self, call, env, plan):
        if plan is not None:
            self.release.wait(60)
            return None
        return super().run(call, env, plan)


class _Leaky(LocalRunner):
    """A runner whose faulty run leaves a shared-memory entry named for this process and a thread."""

    def __init__(self, topo):
        super().__init__(topo)
        self.path = f"/dev/shm/hccl_sim_chaostest-{os.getpid()}-x"
        self.stop = threading.Event()

    def run(self, call, env, plan):
        if plan is not None:
            open(self.path, "wb").close()
            threading.Thread(target=self.stop.wait, name="hccl-leaky", daemon=True).start()
        return super().run(call, env, plan)


class _Refusing(LocalRunner):
    def run(self, call, env, plan):
        if plan is not None:
            raise HcclError("E_NOT_SUPPORT", "not on this engine")
        return super().run(call, env, plan)


@pytest.mark.local
def test_hang_leak_and_skipped_are_detected(a2):
    sc = hand_made(a2, allreduce(count=10), {**FAST, "HCCL_EXEC_TIMEOUT": "1"}, FaultPlan().straggler(0, delay=1e-5))
    blocking = _Blocking(a2)
    try:
        hung = run_scenario(sc, blocking, deadline_s=0.5, margin_s=0)
    finally:
        blocking.release.set()
    assert hung.outcome == "HANG" and "the scenario did not finish within 1 s" in hung.verdict.detail
    leaky = _Leaky(a2)
    try:
        leaked = run_scenario(sc, leaky)
    finally:
        leaky.stop.set()
        os.unlink(leaky.path)
    assert leaked.outcome == "LEAK"
    assert leaky.path in leaked.verdict.detail and "thread hccl-leaky" in leaked.verdict.detail
    skipped = run_scenario(sc, _Refusing(a2))
    assert skipped.outcome == "skipped" and "E_NOT_SUPPORT" in skipped.verdict.detail
    assert run_scenario(sc, LocalRunner(a2)).outcome == "recovered"


@pytest.mark.local
def test_cluster_run_takes_a_plan_and_environment_per_run(a2):
    """What chaos uses to keep one set of Ray actors: Cluster.run(faults=, env=)."""
    def fn(comm):
        comm.all_reduce(np.ones(4, np.int32))
        return comm.last_op.end
    with hccl_sim.Cluster(a2) as cluster:
        clean = cluster.run(fn)
        late = cluster.run(fn, faults=FaultPlan().straggler(2, delay=1e-3))
        assert max(late) - max(clean) == 1_000_000 and cluster.run(fn) == clean
        with pytest.raises(HcclError, match="HCCL_BUFFSIZE"):
            cluster.run(fn, env={"HCCL_BUFFSIZE": "lots"})


# ---- the command ----------------------------------------------------------------------------------

@pytest.mark.campaign
def test_cli_table_json_and_replay(tmp_path, capsys):
    path = tmp_path / "chaos.json"
    args = ["chaos", "-n", "4", "--seed", "2", "--topology", "atlas800t-a2", "--servers", "2"]
    assert main(args + ["--json", str(path)]) == 0
    out, err = capsys.readouterr()
    assert err == ""                                   # no progress bar when stderr is not a terminal
    assert "# hccl-sim chaos: 4 scenarios, seed 2, on atlas800t-a2 (2 servers, 16 ranks, 910B), engine local" in out
    assert "# 4 scenarios: recovered" in out and "OK: no WRONG, HANG or LEAK" in out
    data = json.loads(path.read_text())
    assert [s["index"] for s in data["scenarios"]] == [0, 1, 2, 3] and data["summary"]["scenarios"] == 4
    third = data["scenarios"][3]
    assert third["plan"]["faults"] and third["env"]["HCCL_EXEC_TIMEOUT"] and third["call"]["op"] in CHAOS_OPS
    assert third["outcome"] in ("recovered", "clean error") and len(third["twin_exit_ns"]) == 16
    assert main(["chaos", "--replay", "3", "--seed", "2", "--servers", "2"]) == 0
    replay = capsys.readouterr().out
    assert f"# scenario 3 of seed 2: {third['fault']}" in replay and "plan (YAML):" in replay
    assert f"outcome: {third['outcome']}" in replay and "rank 15 call 0:" in replay


@pytest.mark.campaign
def test_progress_bar_on_a_terminal():
    """On a terminal the bar is drawn to stderr, the table still goes to stdout."""
    import fcntl
    import pty
    import struct
    import subprocess
    import sys
    import termios
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 120, 0, 0))     # a 120-column terminal
    try:
        proc = subprocess.run([sys.executable, "-m", "hccl_sim", "chaos", "-n", "2", "--servers", "1"],
                              stdout=subprocess.PIPE, stderr=slave, timeout=120)
        os.close(slave)
        slave = None
        drawn = b""
        while True:
            try:
                chunk = os.read(master, 1 << 16)
            except OSError:            # the terminal's other end is closed: all read
                break
            if not chunk:
                break
            drawn += chunk
    finally:
        os.close(master)
        if slave is not None:
            os.close(slave)
    assert proc.returncode == 0 and b"# 2 scenarios:" in proc.stdout
    assert b"| 0/2 [" in drawn and b"scenario/s]" in drawn


@pytest.mark.unit
def test_cli_exit_status_1_on_a_failure(monkeypatch, capsys):
    def wrong(sc, runner, deadline_s=60.0):
        return Result(sc.index, Verdict("WRONG", "made up for the test"), 0.0)
    monkeypatch.setattr(report, "run_scenario", wrong)
    assert main(["chaos", "-n", "2", "--servers", "1"]) == 1
    out = capsys.readouterr().out
    assert "WRONG: made up for the test" in out and "FAILED: 2 WRONG/HANG/LEAK" in out


@pytest.mark.unit
@pytest.mark.parametrize("argv,message", [
    (["-n", "0"], "-n 0: the number of scenarios must be in"),
    (["--replay", "-1"], "--replay -1: a scenario number is an integer >= 0"),
    (["--engine", "timing"], "chaos runs on local or ray"),
    (["--deadline", "0"], "--deadline 0"),
    (["--topology", "fullmesh"], "needs --ranks N"),
    (["--topology", "fullmesh", "--ranks", "1"], "chaos needs at least 2 ranks"),
    (["--seed", "x"], "invalid int value"),
    (["--bogus"], "unrecognized arguments"),
])
def test_cli_bad_arguments_exit_2(argv, message, capsys):
    assert main(["chaos"] + argv) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


@pytest.mark.unit
def test_ray_runner_keeps_the_pools_working_set_and_no_more():
    """Between runs a Ray rank may hold its newest CCL input/output/scratch and up to
    RESULT_POOL_SPARE + MAX_CALLS result segments: a rank holding fewer keeps them all (a
    negative slice once dropped all but one of them: a false LEAK), one holding more is reported
    for its oldest; other sessions' and other kinds' names are not the runner's."""
    from types import SimpleNamespace
    from hcomm.memory.segments import PREFIX
    from hccl_sim.chaos.runners import RayRunner
    from hccl_sim.chaos.scenarios import MAX_CALLS
    from hcomm.memory.segment_provider import RESULT_POOL_SPARE
    runner = RayRunner.__new__(RayRunner)
    runner.cluster = SimpleNamespace(session="vm-1-ab")
    allowed = RESULT_POOL_SPARE + MAX_CALLS
    few = {f"{PREFIX}vm-1-ab_0_result_77_{k}" for k in range(5, 5 + allowed - 1)}
    assert runner.kept(few) == few
    many = [f"{PREFIX}vm-1-ab_3_result_77_{k}" for k in range(1, allowed + 3)]
    inputs = [f"{PREFIX}vm-1-ab_3_input_77_{k}" for k in (1, 2)]
    other = f"{PREFIX}vm-2-cd_3_result_77_1"
    kept = runner.kept(set(many) | set(inputs) | {other})
    assert kept == set(many[2:]) | {inputs[1]}
