"""HBM pressure (FaultPlan.hbm_pressure): another tenant of an NPU holds its free HBM. A starved link
setup (the first call of an op type and algorithm on a communicator) fails E_MEMORY on the rank at
once and E_TIMEOUT on its peers after HCCL_CONNECT_TIMEOUT + 20 s; calls already set up, calls of
count 0 and pressures that ended or leave room change nothing; device allocations and a split's
CCL buffer under it fail E_MEMORY naming the entry; simulate; chaos makes and judges it; fault
suites draw it. (Ray: tests/test_ray_faults_transfers.py.) Data are integers."""
import dataclasses

import numpy as np
import pytest

import hccl_sim
import topologies
from hccl_sim import FaultPlan, HcclError
from hccl_sim.plan.loop_programs import op_overhead_ns

GiB = 1 << 30
A2 = hccl_sim.topology("atlas800t-a2")                     # 8 NPUs of one 910B server
FREE = A2.device_model.hbm_bytes - 2 * 200 * (1 << 20)      # beside the world communicator's CCL buffer
CONNECT_NS = 140 * 10**9                                    # HCCL_CONNECT_TIMEOUT 120 s + 20 s


def _ops(comm, ops):
    """Each of `ops` in turn; per call ("ok", value, algo, start, end) or the error's fields and clock."""
    out = []
    for op in ops:
        try:
            if op == "allgather":
                y = comm.all_gather(np.full(2, comm.rank, np.int64))
            else:
                y = comm.all_reduce(np.full(0 if op == "empty" else 8, comm.rank + 1, np.int64))
            out.append(("ok", int(y.sum()), comm.last_op.algo, comm.last_op.start, comm.last_op.end))
        except HcclError as e:
            out.append((e.code, e.cause, e.peers, e.fault, e.time_ns, e.detail, comm.clock))
    return out


def pressure_job(comm):
    return _ops(comm, ("allreduce", "allreduce", "empty", "allgather", "allgather"))


@pytest.mark.local
def test_a_starved_link_setup_fails_e_memory_on_the_rank_and_e_timeout_on_its_peers():
    """From op 1 on, all of rank 3's free HBM is held: op 1 (AllReduce, set up by op 0) and op 2 (count
    0) run as without it; op 3, the first AllGather, sets links up and fails; op 4 fails again."""
    label = "fault plan entry 0 (hbm_pressure rank 3)"
    clean = hccl_sim.run(pressure_job, topology=A2)
    got = hccl_sim.run(pressure_job, topology=A2, faults=FaultPlan().hbm_pressure(3, at_op=1))
    call_ns = op_overhead_ns(A2.device_model, "allgather")
    assert call_ns > 0
    for r in range(8):
        assert got[r][:3] == clean[r][:3]                   # set up already, or nothing to set up
        entry = clean[r][2][4]                              # the clock op 3 is entered at
        if r == 3:
            assert got[r][3] == ("E_MEMORY", "NO_MEMORY", (), label, entry + call_ns,
                                 {"no_memory": True, "link_setup": True, "algo": clean[r][3][2]}, entry + call_ns)
            assert got[r][4][:5] == ("E_MEMORY", "NO_MEMORY", (), label, entry + 2 * call_ns)
        else:
            assert got[r][3] == ("E_TIMEOUT", "TIMEOUT", (3,), label, entry + CONNECT_NS,
                                 {"link_setup": True, "algo": clean[r][3][2], "connect_timeout_s": 140},
                                 entry + CONNECT_NS)
            assert got[r][4][:5] == ("E_TIMEOUT", "TIMEOUT", (3,), label, entry + 2 * CONNECT_NS)
    slower = hccl_sim.run(pressure_job, topology=A2, faults=FaultPlan().hbm_pressure(3, at_op=1),
                          env={"HCCL_CONNECT_TIMEOUT": "300"})
    assert slower[0][3][4] == clean[0][2][4] + 320 * 10**9 and slower[0][3][5]["connect_timeout_s"] == 320


@pytest.mark.local
def test_the_message_is_hccls_and_the_rank_goes_on():
    def fn(comm):
        try:
            comm.all_reduce(np.ones(4, np.int64))
        except HcclError as e:
            return str(e)
        return "ok"
    got = hccl_sim.run(fn, topology=A2, faults=FaultPlan().hbm_pressure(5))
    assert "[rank 5, all_reduce] Cluster Exception Location[rank 5], op all_reduce, algorithm level0:fullmesh, " \
           "link setup at 0.0000" in got[5]
    assert "EI0011 device out of memory in link setup" in got[5] and "(fault plan entry 0 (hbm_pressure rank 5))" in got[5]
    assert "wait socket establish timeout (EI0006)" in got[0] and "rank 5 failed its link setup" in got[0]
    assert "HCCL_E_TIMEOUT (9): [rank 0, all_reduce]" in got[0]


@pytest.mark.local
def test_a_pressure_that_ended_or_leaves_room_changes_nothing():
    late = FaultPlan().straggler(3, delay=2e-6, ops=[0])                 # rank 3 enters op 0 at 2 us
    base = hccl_sim.run(pressure_job, topology=A2, faults=late)
    ended = FaultPlan().straggler(3, delay=2e-6, ops=[0]).hbm_pressure(3, at=0.0, duration=1e-6)
    assert hccl_sim.run(pressure_job, topology=A2, faults=ended) == base
    held = FaultPlan().straggler(3, delay=2e-6, ops=[0]).hbm_pressure(3, at=0.0, duration=3e-6)
    assert hccl_sim.run(pressure_job, topology=A2, faults=held)[3][0][0] == "E_MEMORY"   # still held at 2 us
    clean = hccl_sim.run(pressure_job, topology=A2)
    for nbytes, fails in ((FREE - (1 << 20), False), (FREE - 1024, True), (FREE // 2, False)):
        got = hccl_sim.run(pressure_job, topology=A2, faults=FaultPlan().hbm_pressure(3, bytes=nbytes))
        assert (got[3][0][0] == "E_MEMORY") == fails, nbytes        # a link setup needs 256 KiB beside it
        if not fails:
            assert got == clean


@pytest.mark.local
def test_allocations_under_pressure_fail_naming_the_entry_until_it_ends():
    def fn(comm):
        out = []
        dev = comm.device
        for _ in range(2):
            try:
                arr = dev.malloc(40 * GiB, tag="activations")
                dev.free(arr)
                out.append(("ok", dev.clock))
            except HcclError as e:
                out.append((e.code, e.cause, e.fault, e.time_ns, e.detail["held_bytes"], e.detail["tag"]))
            small = dev.malloc(GiB)                          # fits beside the tenant
            dev.free(small)
            comm.all_reduce(np.ones(4, np.int64))            # the clock moves past the pressure's end
        return out
    got = hccl_sim.run(fn, topology=A2, faults=FaultPlan().hbm_pressure(2, bytes=32 * GiB, duration=1e-5))
    assert got[2][0] == ("E_MEMORY", "NO_MEMORY", "fault plan entry 0 (hbm_pressure rank 2)", 0, 32 * GiB,
                         "activations")
    assert got[2][1][0] == "ok" and got[2][1][1] > 10_000            # past 10 us: the tenant is gone
    assert all(out[0][0] == "ok" for r, out in enumerate(got) if r != 2)
    with pytest.raises(HcclError, match=r"out of HBM at 0.000000 s: activations needs 40.00 GiB, 63.61 GiB of "
                                        r"64.00 GiB free, of which another tenant of the NPU holds 32.00 GiB"):
        hccl_sim.run(lambda comm: comm.device.free(comm.device.malloc(40 * GiB, tag="activations")), topology=A2,
                     faults=FaultPlan().hbm_pressure(2, bytes=32 * GiB))
    # more than the device has left even without the tenant: the device's own out-of-HBM error
    with pytest.raises(HcclError, match="out of HBM: too-big needs") as e:
        hccl_sim.run(lambda comm: comm.device.free(comm.device.malloc(70 * GiB, tag="too-big")), topology=A2,
                     faults=FaultPlan().hbm_pressure(0, bytes=GiB))
    assert e.value.fault is None and e.value.cause == "NO_MEMORY"


def split_between(comm, before, after):
    """`before` ops, a split in two halves (its AllReduce, or its error's fields), `after` ops."""
    out = _ops(comm, before)
    try:
        sub = comm.split(comm.rank % 2)
        out.append(("split", sub.size, int(sub.all_reduce(np.ones(2, np.int64))[0]), comm.clock))
    except HcclError as e:
        out.append((e.code, e.cause, e.peers, e.fault, e.time_ns, e.detail, comm.clock))
    return out + _ops(comm, after)


def split_job(comm):
    return split_between(comm, ("allreduce",), ("allreduce",))


@pytest.mark.local
def test_a_split_under_pressure_fails_e_memory_for_its_ccl_buffer_and_its_peers_init_times_out():
    """Rank 3's tenant comes at op 1 (the split's gather of colours: a bootstrap exchange, set up by
    nobody): the odd ranks' new communicator has no CCL buffer on rank 3. It gets E_MEMORY; ranks
    1, 5, 7 wait for it in the init until HCCL_CONNECT_TIMEOUT + 20 s; the even ranks go on."""
    label = "fault plan entry 0 (hbm_pressure rank 3)"
    clean = hccl_sim.run(split_job, topology=A2)
    got = hccl_sim.run(split_job, topology=A2, faults=FaultPlan().hbm_pressure(3, at_op=1))
    assert [got[r][:2] for r in (0, 2, 4, 6)] == [clean[r][:2] for r in (0, 2, 4, 6)]
    code, cause, peers, fault, at, detail, clock = got[3][1]
    assert (code, cause, peers, fault) == ("E_MEMORY", "NO_MEMORY", (), label)
    assert detail["tag"] == "ccl-buffer" and detail["nbytes"] == 2 * 200 * (1 << 20) and detail["held_bytes"] == FREE
    began = at                                              # the allocation: the new communicator's start
    for r in (1, 5, 7):
        assert got[r][1] == ("E_TIMEOUT", "TIMEOUT", (3,), label, began + CONNECT_NS,
                             {"comm_init": True, "connect_timeout_s": 140}, began + CONNECT_NS)
    assert all(out[2][:2] == ("ok", 288) for out in got)     # the world's AllReduce was set up by op 0
    again = hccl_sim.run(split_job, topology=A2, faults=FaultPlan().hbm_pressure(3, at_op=1, bytes=GiB))
    assert [out[1][0] for out in again] == ["split"] * 8     # a GiB held leaves room for the buffer


@pytest.mark.unit
def test_simulate_raises_the_starved_ranks_e_memory():
    call_ns = op_overhead_ns(A2.device_model, "allreduce")
    with pytest.raises(HcclError, match=r"EI0011 device out of memory in link setup") as e:
        hccl_sim.simulate("allreduce", 1 << 20, topology=A2, faults=FaultPlan().hbm_pressure(6))
    assert (e.value.code, e.value.rank, e.value.time_ns, e.value.fault) == (
        "E_MEMORY", 6, call_ns, "fault plan entry 0 (hbm_pressure rank 6)")
    clean = hccl_sim.simulate("allreduce", 1 << 20, topology=A2)
    assert hccl_sim.simulate("allreduce", 1 << 20, topology=A2,
                             faults=FaultPlan().hbm_pressure(6, bytes=FREE - (1 << 20))) == clean
    assert hccl_sim.simulate("allreduce", 1 << 20, topology=A2, faults=FaultPlan().hbm_pressure(6, at=1.0)) == clean
    with pytest.raises(HcclError, match="EI0011"):
        hccl_sim.simulate("allreduce", 1 << 20, topology=A2, faults=FaultPlan().hbm_pressure(6, at_op=0))
    # a smaller HCCL_BUFFSIZE leaves more free: the same bytes then leave a link setup room
    assert hccl_sim.simulate("allreduce", 1 << 20, topology=A2, env={"HCCL_BUFFSIZE": "100"},
                             faults=FaultPlan().hbm_pressure(6, bytes=FREE - 1024)).time == clean.time


@pytest.mark.unit
@pytest.mark.parametrize("fields,match", [
    (dict(bytes=-1), "bytes must be a number of bytes > 0"),
    (dict(bytes=0), "bytes must be a number of bytes > 0"),
    (dict(bytes=1.5e9), "bytes must be a number of bytes > 0"),
    (dict(bytes=True), "bytes must be a number of bytes > 0"),
    (dict(at=1.0, at_op=2), "give at_op .* or at .*, not both"),
    (dict(at_op=-1), "at_op must be an integer >= 0"),
    (dict(at=-0.5), "at must be a finite number of seconds >= 0"),
    (dict(duration=0), "duration must be a finite number of seconds > 0"),
    (dict(rank=-2), "rank must be a rank"),
])
def test_bad_pressure_entries_are_named(fields, match):
    with pytest.raises(HcclError, match=r"fault plan entry 0 \(hbm_pressure rank .*\): " + match) as e:
        FaultPlan().hbm_pressure(**{"rank": 1, **fields})
    assert e.value.code == "E_PARA"


@pytest.mark.unit
def test_pressure_entries_checked_against_the_topology_and_saved(tmp_path):
    assert FaultPlan().hbm_pressure(1).entries[0] == {"kind": "hbm_pressure", "rank": 1, "at_op": None, "at": 0.0,
                                                      "duration": None, "bytes": None}
    with pytest.raises(HcclError, match=r"entry 0 \(hbm_pressure rank 9\): rank=9 is not a rank of atlas800t-a2"):
        hccl_sim.simulate("allreduce", 64, topology=A2, faults=FaultPlan().hbm_pressure(9))
    with pytest.raises(HcclError, match=r"bytes=137438953472 is more than the 68719476736 B of HBM a 910B device"):
        hccl_sim.simulate("allreduce", 64, topology=A2, faults=FaultPlan().hbm_pressure(1, bytes=128 * GiB))
    plan = FaultPlan(seed=3).hbm_pressure(1, at_op=2, duration=0.5, bytes=GiB).hbm_pressure(0, at=1e-3)
    plan.save(tmp_path / "p.yaml")
    again = FaultPlan.load(tmp_path / "p.yaml")
    assert again.to_dict() == plan.to_dict() and again.entries[1]["at"] == 1e-3
    (tmp_path / "bad.yaml").write_text("faults:\n  - {kind: hbm_pressure, rank: 0, bytes: -5}\n")
    with pytest.raises(HcclError, match=r"bad.yaml: fault plan entry 0 \(hbm_pressure rank 0\): bytes must be"):
        FaultPlan.load(tmp_path / "bad.yaml")


# ---- chaos and fault suites -------------------------------------------------------------------------

@pytest.fixture(scope="module")
def two_servers():
    return topologies.hardware("atlas800t-a2", devices_per_server=[4, 4])


@pytest.mark.local
def test_chaos_judges_a_starved_setup_a_clean_error_and_a_harmless_pressure_recovered(two_servers):
    from hccl_sim.chaos import Call, Scenario, classify, run_scenario
    from hccl_sim.chaos.check import CallRecord
    from hccl_sim.chaos.runners import LocalRunner
    from hccl_sim.chaos.scenarios import rdma_budget, twin_spans
    env = {"HCCL_EXEC_TIMEOUT": "10"}
    call = Call("allreduce", 3000, "int64", "sum", None, None, "new", 2, data_seed=5)

    def scenario(plan, target=0):
        return Scenario(0, 0, call, dict(env), plan, "hand-made", target, tuple(twin_spans(call, env, two_servers)),
                        rdma_budget(two_servers, env))
    runner = LocalRunner(two_servers)
    starved = run_scenario(scenario(FaultPlan().hbm_pressure(6)), runner)
    assert starved.outcome == "clean error", starved.verdict.detail
    assert starved.faulty[6][0].code == "E_MEMORY" and starved.faulty[0][0].code == "E_TIMEOUT"
    later = run_scenario(scenario(FaultPlan().hbm_pressure(6, at_op=1), target=1), runner)   # call 1: set up already
    assert later.outcome == "recovered" and later.faulty == later.twin
    # the checker can fail: an E_MEMORY on a rank the entry does not press, a peer told too early
    sc = scenario(FaultPlan().hbm_pressure(6))
    twin, faulty = starved.twin, [list(recs) for recs in starved.faulty]
    wrong_rank = [faulty[r] if r not in (5, 6) else [faulty[6 if r == 5 else 5][0]] for r in range(8)]
    assert "names the hbm_pressure of rank 6" in classify(sc, twin, wrong_rank).detail
    early = [[recs[0]._replace(end=recs[0].start + 10**9)] if r != 6 else recs for r, recs in enumerate(faulty)]
    assert classify(sc, twin, early).outcome == "WRONG"
    other = [[CallRecord(False, None, 0, 1, code="E_TIMEOUT", message="x",
                         error={**recs[0].error, "detail": {"link_setup": True, "connect_timeout_s": 30}})]
             if r != 6 else recs for r, recs in enumerate(faulty)]
    assert "after 30 s" in classify(sc, twin, other).detail


@pytest.mark.local
def test_chaos_makes_only_pressures_a_run_can_hold_and_every_one_is_judged_clean(two_servers):
    from hccl_sim.chaos import generate, run_scenario
    from hccl_sim.chaos.runners import LocalRunner
    from hccl_sim.chaos.scenarios import space_for
    space = dataclasses.replace(space_for(two_servers), kinds=("hbm_pressure",))
    runner = LocalRunner(two_servers)
    outcomes = []
    for sc in generate(5, 16, two_servers, space):
        assert {e["kind"] for e in sc.plan.entries} == {"hbm_pressure"} and sc.fault.startswith("hbm_pressure rank")
        result = run_scenario(sc, runner)
        assert result.outcome in ("recovered", "clean error"), (sc.fault, result.verdict.detail)
        outcomes.append(result.outcome)
    assert set(outcomes) == {"recovered", "clean error"}


@pytest.mark.local
def test_a_fault_suite_draws_pressures_and_judges_them():
    from hccl_sim.testing import explore

    def fn(comm):
        x = np.arange(6, dtype=np.int64) * (comm.rank + 1)
        return comm.all_reduce(comm.all_gather(comm.all_reduce(x)))

    def body():
        results = hccl_sim.run(fn, topology=hccl_sim.topology("fullmesh", ranks=4, bandwidth=1e9, latency=1e-6))
        assert all((y == results[0]).all() for y in results)
    report = explore(body, "hbm", n=12, seed=2, kinds=("hbm_pressure",))
    counts = report.counts()
    assert not report.failed and counts["WRONG"] == 0, report.summary()
    assert {e["kind"] for s in report.scenarios for e in s.plan.entries} == {"hbm_pressure"}
    assert counts["recovered"] > 0 and counts["clean error"] > 0       # later calls of an op set up already: none
