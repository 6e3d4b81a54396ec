"""Fault plans and what they do: entries checked and named, YAML round trips, link flaps priced as
HCCL's retransmission (just under and just over the budget), slowed links, stragglers, op retry
with HoldTime/IntervalTime and its refusals, bit-identical results, the same times in every engine."""
import re

import numpy as np
import pytest

import hccl_sim
from hccl_sim import FaultPlan, HcclError

DELTA = round(4.096e-6 * 2 ** 5 * 1e9)          # HCCL_RDMA_TIMEOUT=5: one retransmission interval, ns
FAST = {"HCCL_RDMA_TIMEOUT": "5", "HCCL_RDMA_RETRY_CNT": "1"}


def pair():
    """Two ranks, one link, no fixed costs: the first transfer starts at t = 0."""
    return hccl_sim.topology("fullmesh", ranks=2, bandwidth=1e9, latency=1e-6)


def times(plan, env=None, nbytes=1 << 20, topo=None, op="allreduce", algo="ring"):
    return hccl_sim.simulate(op, nbytes, topology=topo or pair(), algo=algo, faults=plan, env={**FAST, **(env or {})})


@pytest.mark.unit
@pytest.mark.parametrize("build,match", [
    (lambda p: p.link_flap(0, 1, at=-1, duration=1), r"entry 0 \(link_flap 0-1\): at must be a finite number"),
    (lambda p: p.link_flap(0, 1, at=0, duration=0), "duration must be a finite number of seconds > 0"),
    (lambda p: p.link_flap(2, 2, at=0, duration=1), "a and b are the same rank"),
    (lambda p: p.link_slow(0, 1, factor=0), "factor must be a number > 0"),
    (lambda p: p.link_slow(0, 1, factor=float("nan")), "factor must be a number > 0"),
    (lambda p: p.nic_down(-1), "rank must be a rank"),
    (lambda p: p.corrupt(0, 1, nth=-2), "nth must be an integer >= 0"),
    (lambda p: p.rank_crash(1), "give exactly one of at_op"),
    (lambda p: p.rank_crash(1, at_step=2, at=0.1), "at_step needs at_op"),
    (lambda p: p.straggler(0, delay=0), "delay must be a finite number of seconds > 0"),
    (lambda p: p.straggler(0, delay=1e-3, ops=[1, -1]), "ops must be a list of op indices"),
])
def test_bad_entries_are_named(build, match):
    with pytest.raises(HcclError, match=match) as e:
        build(FaultPlan())
    assert e.value.code == "E_PARA"


@pytest.mark.unit
def test_entries_checked_against_the_topology():
    with pytest.raises(HcclError, match=r"entry 1 \(link_down 0-9\): b=9 is not a rank of fullmesh"):
        times(FaultPlan().link_slow(0, 1, factor=0.5).link_down(0, 9))
    with pytest.raises(HcclError, match="reaches no peer over RoCE") as e:
        times(FaultPlan().nic_down(3), topo=hccl_sim.topology("atlas800t-a2"))
    assert e.value.code == "E_PARA"
    with pytest.raises(HcclError, match=r"entry 0 \(corrupt 0-2\): b=2 is not a rank of fullmesh"):
        times(FaultPlan().corrupt(0, 2))
    with pytest.raises(HcclError, match=r"HCCL_RDMA_TIMEOUT=22 is out of range \[5, 20\] on 910B"):
        hccl_sim.simulate("allreduce", 64, topology=hccl_sim.topology("atlas800t-a2"), faults=FaultPlan(),
                          env={"HCCL_RDMA_TIMEOUT": "22"})
    with pytest.raises(HcclError, match="HCCL_RDMA_RETRY_CNT"):
        hccl_sim.simulate("allreduce", 64, topology=pair(), env={"HCCL_RDMA_RETRY_CNT": "8"})
    with pytest.raises(HcclError, match="faults must be a hccl_sim.FaultPlan"):
        hccl_sim.simulate("allreduce", 64, topology=pair(), faults={"kind": "link_down"})


@pytest.mark.unit
def test_yaml_round_trip_and_load_errors(tmp_path):
    plan = (FaultPlan(seed=7).link_flap(0, 1, at=1e-3, duration=2e-3).link_slow(1, 0, factor=0.25)
            .straggler(1, delay=5e-4, ops=[2, 0]).rank_crash(0, at_op=3, at_step=1))
    path = tmp_path / "plan.yaml"
    plan.save(path)
    again = FaultPlan.load(path)
    assert again.to_dict() == plan.to_dict() and again.seed == 7 and len(again) == 4
    assert again.to_dict()["faults"][2]["ops"] == [0, 2]
    (tmp_path / "bad.yaml").write_text("seed: 1\nfaults:\n  - kind: link_flap\n    a: 0\n   b: 1\n")
    with pytest.raises(HcclError, match=r"bad.yaml: not valid YAML at line 5"):
        FaultPlan.load(tmp_path / "bad.yaml")
    (tmp_path / "kind.yaml").write_text("faults:\n  - {kind: link_melt, a: 0, b: 1}\n")
    with pytest.raises(HcclError, match=r"kind.yaml: fault plan entry 0: unknown kind 'link_melt'"):
        FaultPlan.load(tmp_path / "kind.yaml")
    (tmp_path / "field.yaml").write_text("faults:\n  - {kind: link_down, a: 0, b: 1, speed: 3}\n")
    with pytest.raises(HcclError, match=r"unknown field\(s\) speed"):
        FaultPlan.load(tmp_path / "field.yaml")
    with pytest.raises(HcclError, match="cannot be read"):
        FaultPlan.load(tmp_path / "missing.yaml")


@pytest.mark.local
def test_flap_just_under_and_just_over_the_retransmission_budget():
    """RETRY_CNT=1: attempts at 0 and DELTA. A flap over [0, DELTA) only delays the op by DELTA; one
    ns longer and the second attempt fails too: an error CQE at 2 DELTA (E_REMOTE)."""
    clean = times(None).time
    late = times(FaultPlan().link_flap(0, 1, at=0, duration=DELTA / 1e9))
    assert late.retries == 0 and round((late.time - clean) * 1e9) == DELTA
    with pytest.raises(HcclError, match=r"error CQE, rank [01] -> rank [01] failed after 2 attempts") as e:
        times(FaultPlan().link_flap(0, 1, at=0, duration=(DELTA + 1) / 1e9))
    assert e.value.code == "E_REMOTE" and "op retry is off for L0" in str(e.value)    # one synthetic "server"
    assert "simulated time 0.000262 s" in str(e.value)            # 2 x 131.072 us
    assert e.value.time_ns == 2 * DELTA

    def fn(comm):                   # every rank's clock moves on to the error CQE, as the message says
        try:
            comm.all_reduce(np.ones(1 << 17, dtype=np.int64), algo="ring")
        except HcclError as exc:
            return exc.code, exc.time_ns, comm.clock
    got = hccl_sim.run(fn, topology=pair(), faults=FaultPlan().link_flap(0, 1, at=0, duration=(DELTA + 1) / 1e9),
                       env=FAST)
    assert got == [("E_REMOTE", 2 * DELTA, 2 * DELTA)] * 2


@pytest.mark.unit
def test_a_flap_the_op_never_meets_changes_nothing():
    clean = times(None)
    assert times(FaultPlan().link_flap(0, 1, at=10.0, duration=1.0)).times == clean.times
    assert times(FaultPlan().link_down(0, 1, at=10.0)).times == clean.times


@pytest.mark.unit
def test_slowed_link_closed_form():
    """A 2-rank ring AllReduce of n bytes: 2 steps of n/2 over the link; at half bandwidth the wire
    time doubles: 2 (latency + n / (0.5 x 1 GB/s))."""
    n = 1 << 20
    slow = times(FaultPlan().link_slow(0, 1, factor=0.5), nbytes=n)
    want = 2 * (1000 + round((n // 2) / 0.5e9 * 1e9))
    assert abs(round(slow.time * 1e9) - want) <= 2
    assert times(FaultPlan().link_slow(0, 1, factor=0.5, at=5.0), nbytes=n).time == times(None, nbytes=n).time


@pytest.mark.local
def test_op_retry_closed_form_and_bit_identical_result():
    """Down for good until 0.05 s: the first try fails at 2 DELTA; HoldTime 30 ms later the link is
    still down, so the retry fails 2 DELTA after it starts; the second retry waits HoldTime +
    IntervalTime and succeeds: it ends one clean op later."""
    env = {"HCCL_OP_RETRY_ENABLE": "L0:1", "HCCL_OP_RETRY_PARAMS": "MaxCnt:2,HoldTime:30,IntervalTime:10"}
    plan = FaultPlan().link_flap(0, 1, at=0, duration=0.05)
    clean = round(times(None).time * 1e9)
    got = times(plan, env=env)
    assert got.retries == 2
    first_fail = 2 * DELTA
    second_start = first_fail + 30_000_000
    third_start = second_start + 2 * DELTA + 30_000_000 + 10_000_000
    assert round(got.time * 1e9) == third_start + clean

    def fn(comm):
        x = (np.arange(50_000, dtype=np.int64) * (comm.rank + 3)) % 1009
        return comm.all_reduce(x, algo="ring"), comm.last_op
    results = hccl_sim.run(fn, topology=pair(), faults=plan, env={**FAST, **env})
    want = sum((np.arange(50_000, dtype=np.int64) * (r + 3)) % 1009 for r in range(2))
    for y, rec in results:
        assert np.array_equal(y, want) and rec.retries == 2
    est = times(plan, env=env, nbytes=50_000 * 8, op="allreduce")
    assert [rec.end - rec.start for _, rec in results] == [round(t * 1e9) for t in est.times]


@pytest.mark.local
def test_a_retried_ops_plan_does_not_keep_its_buffers_alive():
    """The plan keeps every try's LinkFailure (for the trace), but not its traceback: the frames
    of the failed try would keep the op's input and result alive as long as the plan lives (on
    Ray: result segments held between runs)."""
    import weakref
    env = {"HCCL_OP_RETRY_ENABLE": "L0:1", "HCCL_OP_RETRY_PARAMS": "MaxCnt:2,HoldTime:30,IntervalTime:10"}
    plan = FaultPlan().link_flap(0, 1, at=0, duration=0.05)

    def fn(comm):
        x = np.arange(50_000, dtype=np.int64)
        y = comm.all_reduce(x, algo="ring")
        refs = [weakref.ref(x), weakref.ref(y)]
        del x, y
        return comm.last_op.retries, [r() is None for r in refs]
    for retries, freed in hccl_sim.run(fn, topology=pair(), faults=plan, env={**FAST, **env}):
        assert retries == 2 and freed == [True, True]


@pytest.mark.unit
def test_op_retry_refusals():
    env = {"HCCL_OP_RETRY_ENABLE": "L0:1,L1:1", "HCCL_OP_RETRY_PARAMS": "MaxCnt:1,HoldTime:1,IntervalTime:0"}
    with pytest.raises(HcclError, match=r"retries exhausted: 1 of MaxCnt=1") as e:
        times(FaultPlan().link_down(0, 1), env=env)
    assert e.value.code == "E_OPRETRY_FAIL"
    # a broadcast chain 0 -> 1 -> 2 -> 3: rank 0 is done when the 2-3 link fails
    chain = hccl_sim.topology("fullmesh", ranks=4, bandwidth=1e9, latency=1e-6)
    with pytest.raises(HcclError, match=r"cannot retry: rank 0, rank 1 had already left the op") as e:
        hccl_sim.simulate("broadcast", 1 << 16, topology=chain, algo="ring", faults=FaultPlan().link_down(2, 3),
                          env={**FAST, **env})
    assert e.value.code == "E_OPRETRY_FAIL"
    # the failed link's level decides: a link inside a 910B server is L0
    a2 = hccl_sim.topology("atlas800t-a2", servers=2)
    with pytest.raises(HcclError, match=r"\(L0\).*op retry is off for L0") as e:
        hccl_sim.simulate("allreduce", 1 << 20, topology=a2, faults=FaultPlan().link_down(0, 1),
                          env={**FAST, "HCCL_OP_RETRY_ENABLE": "L1:1"})
    ok = hccl_sim.simulate("allreduce", 1 << 20, topology=a2, faults=FaultPlan().link_flap(0, 1, at=0, duration=0.5),
                           env={**FAST, "HCCL_OP_RETRY_ENABLE": "L0:1,L1:0", "HCCL_OP_RETRY_PARAMS": "MaxCnt:1,HoldTime:600"})
    assert ok.retries == 1 and ok.time > 0.6


@pytest.mark.unit
def test_nic_down_fails_every_route_through_it():
    a2 = hccl_sim.topology("atlas800t-a2", servers=2)
    plan = FaultPlan().nic_down(9, at=0, duration=None)
    with pytest.raises(HcclError, match=r"link 9 -> roce -> 1|link 1 -> roce -> 9") as e:
        hccl_sim.simulate("allreduce", 1 << 24, topology=a2, faults=plan, env=FAST)
    assert e.value.code == "E_REMOTE"
    # inside the server rank 9's links still work
    inside = hccl_sim.simulate("allreduce", 1 << 24, topology=hccl_sim.topology("atlas800t-a2", servers=2),
                               faults=FaultPlan().nic_down(9, at=5.0), env=FAST)
    assert inside.retries == 0


@pytest.mark.local
def test_straggler_enters_late_and_the_others_wait():
    topo = hccl_sim.topology("atlas800t-a2")
    clean = hccl_sim.simulate("allreduce", 1 << 20, topology=topo)
    late = hccl_sim.simulate("allreduce", 1 << 20, topology=topo, faults=FaultPlan().straggler(5, delay=1e-3))
    assert abs(late.times[0] - clean.times[0] - 1e-3) < 1e-6 and abs(late.times[5] - clean.times[5]) < 1e-6

    def fn(comm):
        out = []
        for _ in range(3):
            comm.all_reduce(np.ones(16, np.float32))
            out.append(comm.last_op.end)
        return out
    plan = FaultPlan().straggler(2, delay=2e-3, ops=[1])
    base = hccl_sim.run(fn, topology=topo)
    got = hccl_sim.run(fn, topology=topo, faults=plan)
    assert got[0][0] == base[0][0] and got[0][1] - base[0][1] == 2_000_000 and got[0][2] - base[0][2] == 2_000_000


def _slow_peer(comm):
    comm.all_reduce(np.ones(4))
    try:
        comm.all_reduce(np.ones(4))
    except HcclError as e:
        return e.code, e.cause, e.peers, e.fault, e.time_ns, e.detail["slow"], comm.clock
    return "ok", comm.clock


@pytest.mark.local
def test_a_peer_later_than_hccl_exec_timeout_fails_the_op_with_e_timeout_naming_it():
    topo = hccl_sim.topology("atlas800t-a2")
    env = {"HCCL_EXEC_TIMEOUT": "10"}
    got = hccl_sim.run(_slow_peer, topology=topo, env=env, faults=FaultPlan().straggler(3, 12.0, ops=[1]))
    first = got[0][4] - 10_000_000_000              # the first rank's entry into the op
    for r, (code, cause, peers, fault, at, slow, clock) in enumerate(got):
        assert (code, cause, peers, slow) == ("E_TIMEOUT", "TIMEOUT", (3,), 3)
        assert fault == "fault plan entry 0 (straggler rank 3)" and at == first + 10_000_000_000
        assert clock == at if r != 3 else clock > at + 1_000_000_000        # the late rank: its own entry
    assert hccl_sim.run(_slow_peer, topology=topo, env=env, faults=FaultPlan().straggler(3, 9.0, ops=[1]))[0][0] == "ok"
    assert hccl_sim.run(_slow_peer, topology=topo, env={"HCCL_EXEC_TIMEOUT": "0"},        # 0: never
                        faults=FaultPlan().straggler(3, 5000.0, ops=[1]))[0][0] == "ok"


def _stalled_peer(comm):
    comm.all_reduce(np.ones(4))
    try:
        comm.all_reduce(np.ones(4))
    except HcclError as e:
        return e.code, e.cause, e.peers, e.fault, e.time_ns, e.detail.get("stalled"), comm.clock
    return "ok", comm.clock


@pytest.mark.local
def test_a_stalled_rank_is_found_by_its_peers_exec_timeout_and_returns_none():
    import topologies
    topo = topologies.hardware("atlas800t-a2", devices_per_server=[4, 4])
    env = {"HCCL_EXEC_TIMEOUT": "10"}
    got = hccl_sim.run(_stalled_peer, topology=topo, env=env, faults=FaultPlan().rank_stall(5, at_op=1))
    assert got[5] is None                                              # it never comes back
    first = got[0][4] - 10_000_000_000
    for r in (0, 1, 2, 3, 4, 6, 7):
        assert got[r] == ("E_TIMEOUT", "TIMEOUT", (5,), "fault plan entry 0 (rank_stall rank 5)",
                          first + 10_000_000_000, True, first + 10_000_000_000)
    # a stall during op 0 stops the rank before op 1: the device finishes what it was given
    assert hccl_sim.run(_stalled_peer, topology=topo, env=env, faults=FaultPlan().rank_stall(5, at=1e-6)) == got
    with pytest.raises(HcclError, match="found only by its peers' HCCL_EXEC_TIMEOUT, which is 0"):
        hccl_sim.run(_stalled_peer, topology=topo, env={"HCCL_EXEC_TIMEOUT": "0"},
                     faults=FaultPlan().rank_stall(5, at_op=1))
    with pytest.raises(HcclError, match="give exactly one of at_op"):
        FaultPlan().rank_stall(5)
    # HCCL's EI0002 report, its remote rank first (as torch_npu users read it)
    with pytest.raises(HcclError, match=r"EI0002 The wait execution of the Notify register times out, remote rank "
                                        r"\[5\]: rank 5 never entered allreduce \(stalled") as e:
        hccl_sim.simulate("allreduce", 1 << 20, topology=topo, env=env, faults=FaultPlan().rank_stall(5, at_op=0))
    assert e.value.time_ns == 10_000_000_000 and e.value.peers == (5,)


@pytest.mark.local
def test_in_place_op_is_not_retried():
    env = {**FAST, "HCCL_OP_RETRY_ENABLE": "L0:1", "HCCL_OP_RETRY_PARAMS": "MaxCnt:2,HoldTime:1"}
    plan = FaultPlan().link_flap(0, 1, at=0, duration=0.001)

    def fn(comm, inplace):
        x = np.arange(1000, dtype=np.int64) + comm.rank
        y = comm.all_reduce(x, algo="ring", out=x if inplace else None)
        return int(y.sum()), comm.last_op.retries
    assert hccl_sim.run(fn, topology=pair(), faults=plan, env=env, args=(False,)) == [(1000 * 999 + 1000, 1)] * 2
    with pytest.raises(HcclError, match=r"cannot retry an in-place op \(out= aliases the input") as e:
        hccl_sim.run(fn, topology=pair(), faults=plan, env=env, args=(True,))
    assert e.value.code == "E_OPRETRY_FAIL"


def _ops(comm, n=4):
    out = []
    for _ in range(n):
        try:
            y = comm.all_reduce(np.full(8, comm.rank + 1, np.int64))
            out.append(("ok", int(y[0]), comm.last_op.end))
        except HcclError as e:
            out.append((e.code, str(e), comm.clock))
    return out


@pytest.mark.local
def test_rank_crash_at_an_op_survivors_told_when_the_heartbeat_finds_it():
    topo = hccl_sim.topology("atlas800t-a2")
    results = hccl_sim.run(_ops, topology=topo, faults=FaultPlan().rank_crash(3, at_op=1))
    assert results[3] is None                                  # the dead rank's entry
    first_end = results[0][0][2]
    for r in range(8):
        if r == 3:
            continue
        ok, lost, after = results[r][:3]
        assert ok == ("ok", 36, first_end)
        assert lost[0] == "E_TIMEOUT" and "Cluster Exception Location[rank 3]" in lost[1]
        assert "Heartbeat Lost Occurred" in lost[1] and lost[2] == first_end + 30 * 10**9
        assert after[0] == "E_TIMEOUT" and "rank 3 of this communicator was lost" in after[1]
    # HCCL_EXEC_TIMEOUT shorter than the heartbeat's 30 s: a notify wait times out first
    quick = hccl_sim.run(_ops, topology=topo, faults=FaultPlan().rank_crash(3, at_op=1), env={"HCCL_EXEC_TIMEOUT": "10"})
    assert "notify wait timed out" in quick[0][1][1] and quick[0][1][2] == first_end + 10 * 10**9


@pytest.mark.local
def test_rank_crash_mid_op_and_at_a_time():
    topo = hccl_sim.topology("atlas800t-a2")
    mid = hccl_sim.run(_ops, topology=topo, faults=FaultPlan().rank_crash(2, at_op=2, at_step=1))
    clean = hccl_sim.run(_ops, topology=topo)
    assert mid[2] is None and mid[0][:2] == clean[0][:2]
    crashed_at = mid[0][2][2] - 30 * 10**9
    assert clean[0][1][2] < crashed_at < clean[0][2][2]        # inside op 2, after its first step
    # at= seconds: the first op the rank has not left by then (here the third)
    t = (clean[0][1][2] + clean[0][2][2]) / 2 / 1e9
    timed = hccl_sim.run(_ops, topology=topo, faults=FaultPlan().rank_crash(6, at=t))
    assert timed[6] is None and timed[0][2][0] == "E_TIMEOUT" and timed[0][1][0] == "ok"
    assert hccl_sim.run(_ops, topology=topo, faults=FaultPlan().rank_crash(6, at=10.0)) == clean   # after the job
    with pytest.raises(HcclError, match=r"Cluster Exception Location\[rank 1\]") as e:
        hccl_sim.simulate("allreduce", 1024, topology=topo, faults=FaultPlan().rank_crash(1, at_op=0))
    assert e.value.code == "E_TIMEOUT"


@pytest.mark.local
def test_what_a_crashing_rank_does_before_it_dies():
    """What a rank's process runs of the op before it dies (the Ray engine): at_step k runs k steps,
    a crash on entry none, at=t the steps it started before t. And the data k steps move is the
    same on both data paths: every rank's own schedule cut after k steps (per-rank executor, the
    cross-host planes) and the data program's global steps before step k (the shared-memory plane)."""
    import threading
    from hcomm.exec import run_rank, run_share, with_scratch
    from hccl_sim.comm.rank_group import RankBuffers
    from hccl_sim.config.env import Config
    from hccl_sim.plan.faulted import crash_steps, with_faults
    from hccl_sim.plan.planner import Signature, make_plan
    from hccl_sim.plan.event_replay import step_starts
    from hcomm.transports import InProcessTransport
    topo = hccl_sim.topology("fullmesh", ranks=4)
    sig = Signature("allreduce", (64,), "int64", "sum", None, "ring")

    def steps_run(faults):
        config = with_faults(topo, Config.from_env(None, None), faults)
        plan = make_plan(sig, topo, config, [0, 0, 0, 0], 8)
        return crash_steps(config.faults, plan, 0, topo, config), plan, config
    assert steps_run(FaultPlan().rank_crash(2, at_op=0, at_step=3))[0] == 3
    assert steps_run(FaultPlan().rank_crash(2, at_op=0))[0] == 0
    _, plan, config = steps_run(FaultPlan().rank_crash(2, at_op=0))
    marks, _ = step_starts(plan, topo, config, 2)
    assert len(marks) == 6 and marks == sorted(set(marks))         # ring: 2(p-1) steps, each takes time
    assert steps_run(FaultPlan().rank_crash(2, at=(marks[2] + marks[3]) / 2e9))[0] == 3
    two = FaultPlan().rank_crash(1, at_op=0, at_step=2).rank_crash(3, at_op=0, at_step=1)
    with pytest.raises(HcclError, match=r"Cluster Exception Location\[rank 3\]"):   # the earlier of the two
        hccl_sim.simulate("allreduce", 512, topology=topo, algo="ring", faults=two)
    inputs = [np.arange(64, dtype=np.int64) * (r + 1) + 100 * r for r in range(4)]
    for k in (0, 1, 3, 6):
        transport = InProcessTransport(4, 30)
        own = [np.zeros(64, np.int64) for _ in range(4)]
        ranks = [threading.Thread(target=run_rank, args=(plan.data, r, RankBuffers(inputs[r], own[r], None),
                                                         transport, k)) for r in range(4)]
        for t in ranks:
            t.start()
        for t in ranks:
            t.join(30)
        central = [np.zeros(64, np.int64) for _ in range(4)]
        run_share(plan.data, [with_scratch(plan.data, RankBuffers(inputs[r], central[r], None)) for r in range(4)],
                  until=(2, k))
        assert all(np.array_equal(a, b) for a, b in zip(own, central)), k
        assert any(out.any() for out in own) == (k > 0)
    assert all(np.array_equal(out, sum(inputs)) for out in own)     # all 6 steps: the whole AllReduce


@pytest.mark.unit
def test_trace_of_a_retried_op_shows_every_try():
    env = {"HCCL_OP_RETRY_ENABLE": "L0:1", "HCCL_OP_RETRY_PARAMS": "MaxCnt:2,HoldTime:1,IntervalTime:1"}
    topo = hccl_sim.topology("fullmesh", ranks=4, bandwidth=1e9, latency=1e-6)
    est, plan = hccl_sim.simulate("allreduce", 1 << 16, topology=topo, algo="ring", trace=True, env={**FAST, **env},
                                  faults=FaultPlan().link_flap(0, 1, at=0, duration=0.003))
    assert est.retries == 2
    waits = [e for e in plan.events if e[1].startswith("op retry")]
    assert sorted({e[1] for e in waits}) == ["op retry 1: wait", "op retry 2: wait"] and len(waits) == 8
    last_wait_end = max(e[3] for e in waits)
    after = [e for e in plan.events if e[1].startswith("send") and e[2] >= last_wait_end]
    assert after and max(e[3] for e in plan.events) <= round(est.time * 1e9)
    failed = [e for e in plan.events if e[1].endswith("failed")]
    assert len(failed) == 2 and failed[0][2] == 0 and failed[0][3] == 2 * DELTA   # the first try's error CQE


@pytest.mark.unit
def test_crash_mid_op_in_an_op_retried_after_a_link_failure():
    """(chaos seed 11, scenario 280: was E_INTERNAL, a LinkFailure escaping the step clock.) A
    mid-op crash in an op that op retry rescues: the step is found try by try. Ring AllReduce on
    4 ranks with link 0-1 down for 1 ms: the first try ends in its error CQE at 2 DELTA before rank
    3 has started any step, so rank 3 dies in the retry (from 2 DELTA + HoldTime), at its step k."""
    env = {**FAST, "HCCL_OP_RETRY_ENABLE": "L0:1", "HCCL_OP_RETRY_PARAMS": "MaxCnt:2,HoldTime:1,IntervalTime:0"}
    ring4 = hccl_sim.topology("fullmesh", ranks=4, bandwidth=1e9, latency=1e-6)
    flap = dict(a=0, b=1, at=0, duration=1e-3)
    retried = times(FaultPlan().link_flap(**flap), env=env, nbytes=1 << 16, topo=ring4)
    assert retried.retries == 1
    crashed = []
    for step in (0, 2, 4):
        plan = FaultPlan().link_flap(**flap).rank_crash(3, at_op=0, at_step=step)
        with pytest.raises(HcclError, match=r"Cluster Exception Location\[rank 3\]") as e:
            times(plan, env=env, nbytes=1 << 16, topo=ring4)
        assert e.value.code == "E_TIMEOUT"
        crashed.append(float(re.search(r"crashed at ([0-9.]+) s", str(e.value)).group(1)))
    retry_start = (2 * DELTA + 1_000_000) / 1e9
    assert retry_start - 1e-6 <= crashed[0] < crashed[1] < crashed[2] < retried.time
