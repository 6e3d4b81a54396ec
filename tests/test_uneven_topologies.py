"""Every op on the shapes HCCL accepts beyond full servers: servers of unequal size at every level,
one NPU per server, gaps in device ids (910B servers of 8, 3 and 1; A3 superpods of unequal servers
of unequal die counts, one-die servers; the 950's ids to 64; 910A's two groups), each result against the reference;
what HCCL refuses on them (the V ops on A3 servers of unequal die counts, on 910A) refused. And the
rank table's device ids as each preset's HCCL parser takes them (docs/references.md §8.1)."""
import numpy as np
import pytest

import hccl_sim
from hccl_sim import HcclError
from hccl_sim import collectives as colls
from hccl_sim.collectives.splits import parse
from hccl_sim.collectives.verifiable import rank_input
from topologies import ranktable
from topologies.presets import hardware

OPS = tuple(name for name, c in colls.COLLECTIVES.items() if c.carries_data)
SKEWED = parse("zipf:1.1")           # the V ops' blocks of unequal sizes, zeros among them
COUNT = 24

SHAPES = {
    "910B servers of 8, 3, 1": (("atlas800t-a2",), dict(devices_per_server=[8, 3, 1]), ()),
    "910B gapped ids": (("atlas800t-a2",), dict(devices_per_server=[3, 1, 4],
                                                device_ids=[[0, 2, 5], [7], [1, 3, 4, 6]]), ()),
    "910B one NPU per server": (("atlas800t-a2",), dict(devices_per_server=[1, 1, 1], device_ids=[[0], [5], [2]]),
                                ()),
    "A3 unequal superpods of unequal servers": (("atlas900-a3",), dict(devices_per_server=[16, 4, 1, 2],
                                                                       device_ids=[list(range(16)), [0, 1, 6, 9], [3],
                                                                                   [14, 15]],
                                                                       pod_of_server=[0, 0, 0, 1]),
                                                ("allgatherv", "reducescatterv")),
    "A3 unequal superpods of equal servers": (("atlas900-a3",), dict(superpods=2, servers=[2, 1]), ()),
    "A3 one-die servers": (("atlas900-a3",), dict(devices_per_server=[1, 1, 1], device_ids=[[0], [3], [6]],
                                                  pod_of_server=[0, 0, 1]), ()),
    "950 superpods of unequal servers, gapped ids to 64": (("atlas950",), dict(
        devices_per_server=[8, 3, 1], device_ids=[list(range(8)), [0, 17, 64], [40]], pod_of_server=[0, 0, 1]), ()),
    "950 servers of 2 in two superpods": (("atlas950",), dict(devices_per_server=[2, 2, 2, 2],
                                                              pod_of_server=[0, 0, 1, 1]), ()),
    "910A servers of 8 and 3": (("atlas800-910a",), dict(devices_per_server=[8, 3],
                                                         device_ids=[list(range(8)), [0, 5, 6]]),
                                ("allgatherv", "reducescatterv")),
}


def every_op(comm):
    """Each op's outcome on this rank: True (the reference's result), or the refusal's code."""
    p, r, root = comm.size, comm.rank, comm.size - 1
    outcome = {}
    for name in OPS:
        coll = colls.get(name)
        kwargs = ({"op": "sum"} if coll.reducing else {}) | ({"root": root} if coll.rooted else {})
        counts = coll.counts_for(SKEWED, p, COUNT)
        try:
            if counts is None:
                x = rank_input(r, coll.input_shape_for_bytes(COUNT * 4, p, 4)[0], "int32")
                got, want = getattr(comm, coll.method)(x, **kwargs), coll.verifiable(r, p, x.size, "int32", "sum", root)
            else:
                x = rank_input(r, coll.input_rows(counts, r), "int32")
                got = getattr(comm, coll.method)(x, *coll.call_counts(counts, r), **kwargs)
                want = coll.verifiable_v(counts, r, "int32")
            outcome[name] = got is None if want is None else np.array_equal(np.asarray(got).reshape(-1), want)
        except HcclError as exc:
            outcome[name] = exc.code
    # BatchSendRecv round the ring: a block to the next rank, one from the previous
    sent = rank_input(r, 5, "int32")
    got = comm.batch_send_recv([("send", (r + 1) % p, sent), ("recv", (r - 1) % p, ((5,), "int32"))])
    outcome["batch_send_recv"] = np.array_equal(got[0], rank_input((r - 1) % p, 5, "int32"))
    return outcome


@pytest.mark.local
@pytest.mark.parametrize("shape", list(SHAPES))
def test_every_op_on_uneven_servers(shape):
    (preset,), layout, refused = SHAPES[shape]
    for rank, outcome in enumerate(hccl_sim.run(every_op, topology=hardware(preset, **layout))):
        want = {name: "E_NOT_SUPPORT" if name in refused else True for name in OPS + ("batch_send_recv",)}
        assert outcome == want, (shape, rank)


def _table(devices_per_server, version="1.0"):
    servers = [{"server_id": f"node_{s}", "device": [
        {"device_id": str(d), "device_ip": f"10.0.{s}.{d}", "rank_id": str(rank), "super_device_id": str(rank)}
        for rank, d in ids]} for s, ids in enumerate(devices_per_server)]
    table = {"status": "completed", "version": version, "server_count": str(len(servers)), "server_list": servers}
    if version == "1.2":
        table["super_pod_list"] = [{"super_pod_id": "0", "server_list": [{"server_id": s["server_id"]}
                                                                         for s in servers]}]
    return table


@pytest.mark.unit
def test_rank_table_device_ids_as_hccls_parser_takes_them():
    # gaps and one device per server load as they are listed
    topo = ranktable.parse(_table([[(0, 0), (1, 2), (2, 5)], [(3, 7)]]))
    assert topo.device_of == [0, 2, 5, 7] and topo.server_of == [0, 0, 0, 1]
    # A3: ids up to GetMaxDevNum - 1 = 15; 910B's one module and 910A: up to 7
    assert ranktable.parse(_table([[(0, 15), (1, 3)]], "1.2")).device_of == [15, 3]
    for preset, version, bad in (("atlas900-a3", "1.2", 16), ("atlas800t-a2", "1.0", 8), ("atlas800-910a", "1.0", 8)):
        with pytest.raises(HcclError, match=rf"device_id: {bad} is out of range \[0, {bad - 1}\]"):
            ranktable.parse(_table([[(0, bad)]], version), preset=preset)
    with pytest.raises(HcclError, match=r"device_id 9 is out of range \[0, 7\]"):
        hardware("atlas800t-a2", devices_per_server=[2], device_ids=[[0, 9]])
    with pytest.raises(HcclError, match="are not 2 distinct ids"):
        hardware("atlas800t-a2", devices_per_server=[2], device_ids=[[3, 3]])
