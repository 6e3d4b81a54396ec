"""`with comm.group():` (HcclGroupStart/End): sends, receives and collectives held and launched as
HCCL launches them (one batch, then the fixed-size collectives by data volume, then the
variable-size ones in issue order), nesting, groups over two communicators, what HCCL does not
group, and failures at the group's end without a hang."""
import numpy as np
import pytest

import hccl_sim
from hccl_sim import HcclError


def _mixed(comm):
    r, p = comm.rank, comm.size
    with comm.group():
        got = comm.recv((r - 1) % p)
        small = comm.all_reduce(np.arange(4, dtype=np.int32) * (r + 1))
        v = comm.all_to_all_v(np.arange(2 * p, dtype=np.int32) + 100 * r, [2] * p, [2] * p)
        big = comm.all_gather(np.full(1000, r, dtype=np.int32))
        comm.send(np.full(3, r, dtype=np.int32), (r + 1) % p)
        rs = comm.reduce_scatter(np.ones(8 * p, dtype=np.int32))
        inside = (got.is_completed(), small.is_completed())
    order = [name for name, _, _ in comm.device.default_stream.tasks]
    return inside, got.result, small.result, v.wait(), big.result, rs.result, order


@pytest.mark.local
@pytest.mark.parametrize("p", [1, 2, 3, 5, 8])
def test_sends_receives_and_collectives_launch_as_hccl_orders_them(p):
    for r, (inside, got, small, v, big, rs, order) in enumerate(
            hccl_sim.run(_mixed, topology=hccl_sim.topology("fullmesh", ranks=p))):
        assert inside == (False, False)                    # nothing ran before the group ended
        assert np.array_equal(got, np.full(3, (r - 1) % p))
        assert np.array_equal(small, np.arange(4) * sum(range(1, p + 1)))
        assert np.array_equal(v, np.concatenate([[100 * q + 2 * r, 100 * q + 2 * r + 1] for q in range(p)]))
        assert np.array_equal(big, np.repeat(np.arange(p), 1000)) and np.array_equal(rs, np.full(8, p))
        # one batch, then by data volume (AllGather's 4000 B input, ReduceScatter's 32 B output,
        # AllReduce's 16 B), then the variable-size op
        assert order == ["batch_send_recv", "all_gather", "reduce_scatter", "all_reduce", "all_to_all_v"], order


@pytest.mark.local
def test_nested_groups_launch_at_the_outermost_end_and_results_wait_for_it():
    def fn(comm):
        with comm.group():
            with comm.group():
                a = comm.all_reduce(np.ones(3))
            after_inner = a.is_completed()
            with pytest.raises(HcclError, match="its result is there once the group has ended"):
                a.wait()
        return after_inner, a.result
    for after_inner, result in hccl_sim.run(fn, topology=hccl_sim.topology("fullmesh", ranks=3)):
        assert after_inner is False and np.array_equal(result, np.full(3, 3.0))


@pytest.mark.local
def test_a_group_spans_communicators_in_the_order_first_used():
    def fn(comm):
        sub = comm.split(comm.rank % 2)
        with comm.group():
            s = sub.all_reduce(np.ones(2))
            w = comm.all_reduce(np.ones(2))
        return s.result.tolist(), w.result.tolist(), [name for name, _, _ in comm.device.default_stream.tasks][-2:]
    for s, w, order in hccl_sim.run(fn, topology=hccl_sim.topology("fullmesh", ranks=4)):
        assert s == [2.0, 2.0] and w == [4.0, 4.0] and order == ["all_reduce", "all_reduce"]


@pytest.mark.local
@pytest.mark.parametrize("call,code,match", [
    (lambda c: c.barrier(), "E_NOT_SUPPORT", "barrier inside comm.group"),
    (lambda c: c.batch_send_recv([]), "E_NOT_SUPPORT", "does not allow BatchSendRecv in a group"),
    (lambda c: c.split(0), "E_NOT_SUPPORT", "communicator management"),
    (lambda c: c.send(np.ones(2), (c.rank + 1) % c.size, tag=3), "E_PARA", "carry no tag"),
])
def test_what_hccl_does_not_group_is_refused(call, code, match):
    def fn(comm):
        with comm.group():
            call(comm)
    with pytest.raises(HcclError, match=match) as info:
        hccl_sim.run(fn, topology=hccl_sim.topology("fullmesh", ranks=2))
    assert info.value.code == code


@pytest.mark.local
def test_no_group_on_910a():
    def fn(comm):
        with comm.group():
            pass
    with pytest.raises(HcclError, match="does not run on 910A") as info:
        hccl_sim.run(fn, topology=hccl_sim.topology("atlas800-910a", servers=1))
    assert info.value.code == "E_NOT_SUPPORT"


@pytest.mark.local
def test_a_failure_is_raised_at_the_groups_end_and_an_exception_inside_launches_nothing():
    def mismatch(comm):
        with comm.group():
            comm.all_reduce(np.ones(3 if comm.rank else 4))
    with pytest.raises(HcclError, match="mismatched collective calls") as info:
        hccl_sim.run(mismatch, topology=hccl_sim.topology("fullmesh", ranks=3), env={"HCCL_EXEC_TIMEOUT": "20"})
    assert info.value.code == "E_PARA"

    def abandoned(comm):
        try:
            with comm.group():
                comm.all_reduce(np.ones(3))
                raise KeyError("user code")
        except KeyError:
            pass
        return comm.device.default_stream.tasks, comm.all_reduce(np.ones(2)).tolist()
    for tasks, later in hccl_sim.run(abandoned, topology=hccl_sim.topology("fullmesh", ranks=3)):
        assert later == [3.0, 3.0] and [t[0] for t in tasks] == ["all_reduce"]


@pytest.mark.local
def test_the_group_runs_its_launches_one_after_another_in_simulated_time():
    """The batch, then each collective entering where the one before left: the group costs the
    sum of its launches, each priced as it would be alone."""
    topo = hccl_sim.topology("atlas800t-a2", servers=1)

    def grouped(comm):
        r, p = comm.rank, comm.size
        with comm.group():
            comm.send(np.ones(1000, dtype=np.float32), (r + 1) % p)
            comm.recv((r - 1) % p)
            comm.all_reduce(np.ones(1 << 16, dtype=np.float32))
        return comm.clock

    def alone(comm):
        r, p = comm.rank, comm.size
        comm.batch_send_recv([("send", (r + 1) % p, np.ones(1000, dtype=np.float32)),
                              ("recv", (r - 1) % p, ((1000,), "float32"))])
        comm.all_reduce(np.ones(1 << 16, dtype=np.float32))
        return comm.clock
    assert hccl_sim.run(grouped, topology=topo) == hccl_sim.run(alone, topology=topo)
