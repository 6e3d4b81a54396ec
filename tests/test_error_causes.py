"""HcclError's structured causes: what happened as fields (cause, peers, link, level, simulated time,
fault-plan entry, details) beside the unchanged message; the fields survive the boundaries errors
cross (pickles for Ray, the outcome dicts of MPI's run, JSON transfer replies); the one root-cause
rule every engine uses to pick a job's error (hccl_sim.engines.rendezvous.root_cause)."""
import json
import pickle

import numpy as np
import pytest

import hccl_sim
from hccl_sim import FaultPlan, HcclError
from hccl_sim.engines import rendezvous as rdv
from hccl_sim.engines.mpi import error_of, outcome_of
from hccl_sim.engines.ray.protocol import Outcome, died_outcome
from topologies.errors import CAUSES, CONSEQUENCES, Cause

pytestmark = pytest.mark.timeout(120)

FAST = {"HCCL_RDMA_TIMEOUT": "5", "HCCL_RDMA_RETRY_CNT": "1"}


def _link_error():
    return HcclError("E_REMOTE", "Cluster Exception Location[link 0 -> 1 (L1)], ...", rank=3, op="all_reduce",
                     time_ns=1234, cause=Cause.LINK_FAILED, link=(0, 1), level="L1",
                     fault="fault plan entry 0 (link_down 0-1)", detail={"attempts": 2})


# ---- the error's fields -----------------------------------------------------------------------------

@pytest.mark.unit
def test_the_constructor_stays_backward_compatible_and_the_message_unchanged():
    old = HcclError("E_PARA", "bad", 2, "all_reduce", 7)
    assert (old.code, old.reason, old.rank, old.op, old.time_ns) == ("E_PARA", "bad", 2, "all_reduce", 7)
    assert str(old) == "HCCL_E_PARA (1): [rank 2, all_reduce] bad"
    assert old.cause is None and old.peers == () and old.peer is None and old.link is None and old.detail == {}
    assert not old.consequence
    new = _link_error()
    assert str(new) == "HCCL_E_REMOTE (21): [rank 3, all_reduce] Cluster Exception Location[link 0 -> 1 (L1)], ..."
    with pytest.raises(TypeError):
        HcclError("E_PARA", "bad", 2, "all_reduce", 7, Cause.MISMATCH)      # fields are keyword-only
    with pytest.raises(ValueError, match="unknown HcclError cause"):
        HcclError("E_PARA", "bad", cause="SOMETHING")
    assert HcclError("E_PARA", "x", peers=4).peers == (4,) and HcclError("E_PARA", "x", peers=[1, 2]).peer == 1
    assert CONSEQUENCES < CAUSES


@pytest.mark.unit
def test_fields_survive_pickle_replace_and_json():
    err = _link_error()
    err.remote_traceback = "Traceback ..."
    for back in (pickle.loads(pickle.dumps(err)), err.replace()):
        assert type(back) is HcclError and str(back) == str(err) and back.fields() == err.fields()
        assert (back.code, back.rank, back.op) == ("E_REMOTE", 3, "all_reduce")
        assert back.remote_traceback == "Traceback ..."
    moved = err.replace(rank=5, op="reduce")
    assert moved.rank == 5 and "[rank 5, reduce]" in str(moved) and moved.fields() == err.fields()
    # a transfer's reply crosses the socket and MPI transports as JSON: tuples come back as lists
    plain = json.loads(json.dumps(err.fields()))
    assert HcclError("E_REMOTE", err.reason, **plain).fields() == err.fields()
    try:
        import cloudpickle                              # Ray's pickler
    except ImportError:
        return
    assert cloudpickle.loads(cloudpickle.dumps(err)).fields() == err.fields()


@pytest.mark.unit
def test_fields_cross_ray_outcomes_and_mpi_outcome_dicts():
    err = _link_error()
    ray_back = pickle.loads(pickle.dumps(Outcome.failed(3, err, at=1.5))).error()
    assert str(ray_back) == str(err) and ray_back.fields() == err.fields()
    mpi_back = error_of(pickle.loads(pickle.dumps(outcome_of(3, err))))
    assert str(mpi_back) == str(err) and mpi_back.fields() == err.fields()
    other = error_of(outcome_of(1, ZeroDivisionError("boom")))
    assert other.code == "E_INTERNAL" and other.cause is None and "ZeroDivisionError: boom" in str(other)
    dead = died_outcome(2, "its actor died: ...", 1.0).error()
    assert dead.cause == Cause.RANK_DIED and not dead.consequence


# ---- the root-cause rule ------------------------------------------------------------------------------

def _err(cause, code="E_REMOTE", rank=0):
    return HcclError(code, f"{cause}", rank=rank, cause=cause)


@pytest.mark.unit
def test_root_cause_is_the_earliest_error_that_is_no_consequence():
    returned = _err(Cause.PEER_RETURNED, "E_PARA")
    lost = _err(Cause.RANK_LOST, "E_TIMEOUT", rank=1)
    # a peer's return (perhaps because it was lost) is a consequence: the loss is the job's error
    # (Ray used to pick the earlier "returned without", MPI the loss)
    assert rdv.root_cause([(0, returned, 1.0), (1, lost, 2.0)])[1] is lost
    # an error CQE is E_REMOTE like an abort, yet no consequence: it wins over an earlier abort
    aborted, cqe = _err(Cause.ABORTED), _err(Cause.LINK_FAILED, rank=2)
    assert rdv.root_cause([(0, aborted, 1.0), (2, cqe, 3.0)])[1] is cqe
    # a user's exception is no consequence either; a dead actor neither
    user = ValueError("boom")
    assert rdv.root_cause([(0, _err(Cause.PEER_FAILED), 1.0), (4, user, 2.0)])[1] is user
    died = _err(Cause.RANK_DIED, rank=5)
    assert rdv.root_cause([(1, _err(Cause.PEER_LOST), 1.0), (5, died, 9.0)])[1] is died
    # only consequences: the earliest of them; equal times: the lower rank
    first = _err(Cause.PEER_RETURNED, "E_PARA", rank=3)
    assert rdv.root_cause([(2, _err(Cause.ABORTED), 2.0), (3, first, 1.0)])[1] is first
    assert rdv.root_cause([(2, cqe, 1.0), (1, lost, 1.0)])[0] == 1
    # unclassified errors are no consequence (the old rule read "aborted" in their text)
    plain = HcclError("E_PARA", "aborted something")
    assert rdv.root_cause([(0, _err(Cause.ABORTED), 0.5), (1, plain, 1.0)])[1] is plain
    # extra items ride along
    assert rdv.root_cause([(0, cqe, 1.0, "mine")])[3] == "mine"
    with pytest.raises(ValueError):
        rdv.root_cause([])


@pytest.mark.local
def test_local_engine_reports_the_root_cause_not_the_first_error():
    """Rank 1 returns at once, so rank 0's AllReduce fails first (a consequence: PEER_RETURNED);
    rank 2's own exception comes later and is the job's error."""
    with pytest.raises(HcclError) as info:
        hccl_sim.run(own_bug_after_a_peer_returned, topology=hccl_sim.topology("fullmesh", ranks=3))
    assert info.value.rank == 2 and "ZeroDivisionError: rank 2's own bug" in str(info.value)
    # with nothing else wrong, the consequence is the error
    with pytest.raises(HcclError, match="rank 1 returned without calling all_reduce") as info:
        hccl_sim.run(lambda c: None if c.rank == 1 else c.all_reduce(np.ones(4)),
                     topology=hccl_sim.topology("fullmesh", ranks=3))
    assert info.value.cause == Cause.PEER_RETURNED and info.value.peers == (1,)
    assert info.value.detail == {"missed": "call"}


# ---- what the engines and op retry raise ---------------------------------------------------------------

def _collect(fn, topo, **kw):
    def wrapped(comm):
        try:
            return fn(comm)
        except HcclError as exc:
            return exc
    return hccl_sim.run(wrapped, topology=topo, **kw)


@pytest.mark.local
def test_mismatch_bad_input_and_peer_failure_causes():
    topo = hccl_sim.topology("fullmesh", ranks=4)
    got = _collect(lambda c: c.all_reduce(np.ones(4 + (c.rank == 2))), topo)
    assert all(e.cause == Cause.MISMATCH and e.code == "E_PARA" for e in got)
    got = _collect(lambda c: c.broadcast(np.ones(2), root=7), topo)
    assert all(e.cause == Cause.BAD_INPUT for e in got)

    def failing(comm):
        if comm.rank == 3:
            raise KeyError("x")
        comm.all_reduce(np.ones(4))
    errors = []

    def keep(comm):
        try:
            return failing(comm)
        except HcclError as exc:
            errors.append(exc)
            raise
    with pytest.raises(HcclError, match="KeyError"):
        hccl_sim.run(keep, topology=topo)
    assert errors and all(e.consequence for e in errors)
    assert all(e.cause in (Cause.PEER_FAILED, Cause.ABORTED) for e in errors)
    assert all(e.peers == (3,) for e in errors if e.cause == Cause.PEER_FAILED)


@pytest.mark.unit
def test_link_failure_and_retry_refusals_carry_link_level_entry_and_details():
    a2 = hccl_sim.topology("atlas800t-a2", servers=2)
    plan = FaultPlan().link_down(1, 6)
    with pytest.raises(HcclError) as e:
        hccl_sim.simulate("allreduce", 1 << 20, topology=a2, faults=plan, env=FAST)
    err = e.value
    assert err.code == "E_REMOTE" and err.cause == Cause.LINK_FAILED and err.level == "L0"
    assert err.fault == "fault plan entry 0 (link_down 1-6)" and err.fault in err.reason
    assert err.link is not None and err.time_ns is not None and err.detail["attempts"] == 2
    env = {**FAST, "HCCL_OP_RETRY_ENABLE": "L0:1", "HCCL_OP_RETRY_PARAMS": "MaxCnt:2,HoldTime:1,IntervalTime:0"}
    with pytest.raises(HcclError, match="retries exhausted: 2 of MaxCnt=2") as e:
        hccl_sim.simulate("allreduce", 1 << 20, topology=a2, faults=plan, env=env)
    assert e.value.cause == Cause.OPRETRY_FAIL and e.value.level == "L0"
    assert {k: e.value.detail[k] for k in ("refused", "max_cnt", "tries")} == {"refused": "exhausted", "max_cnt": 2,
                                                                                "tries": 2}
    chain = hccl_sim.topology("fullmesh", ranks=4, bandwidth=1e9, latency=1e-6)
    with pytest.raises(HcclError, match="had already left the op") as e:
        hccl_sim.simulate("broadcast", 1 << 16, topology=chain, algo="ring", faults=FaultPlan().link_down(2, 3),
                          env={**env, "HCCL_OP_RETRY_ENABLE": "L0:1"})
    assert e.value.detail["refused"] == "left" and tuple(e.value.detail["left"]) == (0, 1)

    def inplace(comm):
        x = np.arange(1000, dtype=np.int64)
        comm.all_reduce(x, algo="ring", out=x)
    got = _collect(inplace, hccl_sim.topology("fullmesh", ranks=2, bandwidth=1e9, latency=1e-6),
                   faults=FaultPlan().link_flap(0, 1, at=0, duration=0.001), env=env)
    assert all(g.cause == Cause.OPRETRY_FAIL and g.detail["refused"] == "in-place" for g in got)
    assert len({(g.time_ns, g.fault, g.link) for g in got}) == 1      # one failure, the same on every rank


@pytest.mark.local
def test_send_recv_link_failure_reaches_both_ends_with_its_fields():
    topo = hccl_sim.topology("fullmesh", ranks=2, bandwidth=1e9, latency=1e-6)

    def p2p(comm):
        if comm.rank == 0:
            comm.send(np.ones(1 << 16), dst=1)
        else:
            comm.recv(src=0)
    got = _collect(p2p, topo, faults=FaultPlan().link_down(0, 1), env=FAST)
    assert [g.op for g in got] == ["send", "recv"] and got[0].reason == got[1].reason
    assert all(g.cause == Cause.LINK_FAILED and g.link == (0, 1) and g.level == "L0" for g in got)
    assert got[0].fields() == got[1].fields()


@pytest.mark.local
def test_a_lost_rank_is_named_with_its_entry_and_when_it_crashed():
    topo = hccl_sim.topology("atlas800t-a2")

    def ops(comm):
        out = []
        for _ in range(3):
            try:
                comm.all_reduce(np.ones(8))
            except HcclError as exc:
                out.append(exc)
        return out
    got = hccl_sim.run(ops, topology=topo, faults=FaultPlan().rank_crash(3, at_op=1), env={"HCCL_EXEC_TIMEOUT": "10"})
    assert got[3] is None
    for r, errors in enumerate(got):
        if r == 3:
            continue
        lost, after = errors
        assert lost.cause == after.cause == Cause.RANK_LOST and lost.peers == after.peers == (3,)
        assert lost.fault == after.fault == "fault plan entry 0 (rank_crash rank 3)"
        assert lost.detail["detected_by"] == "HCCL_EXEC_TIMEOUT" and lost.detail["wait_s"] == 10
        assert lost.time_ns == lost.detail["crashed_ns"] + 10 * 10**9
        assert after.detail["crashed_ns"] == lost.detail["crashed_ns"] and after.time_ns is None
        assert not lost.consequence


@pytest.mark.unit
def test_transport_and_control_plane_waits_say_who():
    from hcomm.transports import base
    assert base.take_exited(1, 0, "t", "recv").detail == {"missed": "send"}
    assert base.consume_exited(0, 1, "t", "send").peers == (1,)
    assert base.peer_lost(2, 0, "gone", None).cause == Cause.PEER_LOST
    assert base.take_timeout(1, 0, 1.0, None).cause == Cause.TIMEOUT
    state = base.AbortState()
    state.set("E_REMOTE", "rank 1 failed: x")
    with pytest.raises(HcclError) as e:
        state.check(0, "all_reduce")
    assert e.value.cause == Cause.ABORTED and str(e.value).endswith("aborted: rank 1 failed: x")
    from hcomm.control.mpi import FAILED, LEFT, LOST, MpiControl
    for kind, cause in ((LEFT, Cause.PEER_RETURNED), (FAILED, Cause.PEER_FAILED), (LOST, Cause.PEER_LOST)):
        with pytest.raises(HcclError) as e:
            MpiControl.decide([(0, b""), (kind, b"why")], 4, 0, "all_reduce")
        assert e.value.cause == cause and e.value.peers == (1,)


# ---- the same rule and fields across processes ----------------------------------------------------------

def own_bug_after_a_peer_returned(comm):
    """Rank 1 returns at once, so rank 0's AllReduce fails first (PEER_RETURNED, a consequence);
    rank 2's own exception, a second later, is the job's error."""
    import time
    if comm.rank == 1:
        return None
    if comm.rank == 2:
        time.sleep(1.0)
        raise ZeroDivisionError("rank 2's own bug")
    comm.all_reduce(np.ones(4))


def link_down_job(comm):
    comm.all_reduce(np.arange(1 << 14, dtype=np.int64))


@pytest.mark.ray
def test_ray_engine_picks_the_same_root_cause_and_keeps_the_fields(ray_cluster):
    """Ray used to pick the earlier "returned without" (an E_PARA); every engine now picks rank 2's
    own error. An error CQE's fields cross the actors to the driver."""
    with hccl_sim.Cluster(hccl_sim.topology("fullmesh", ranks=3), engine="ray") as cluster:
        with pytest.raises(HcclError) as info:
            cluster.run(own_bug_after_a_peer_returned)
        assert info.value.rank == 2 and "ZeroDivisionError: rank 2's own bug" in str(info.value)
        with pytest.raises(HcclError) as info:
            cluster.run(link_down_job, faults=FaultPlan().link_down(0, 1), env=FAST)
        err = info.value
        assert err.code == "E_REMOTE" and err.cause == Cause.LINK_FAILED and err.level == "L0"
        assert err.fault == "fault plan entry 0 (link_down 0-1)" and err.link in ((0, 1), (1, 0))
        assert err.time_ns is not None
