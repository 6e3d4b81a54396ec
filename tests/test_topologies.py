"""Presets, routes, ports, incast, and HCCL rank-table import/export with HCCL's validation."""
import copy
import json

import numpy as np
import pytest

import hccl_sim
import topologies
from hcomm.steps import Recv, Send, Slice
from hcomm.timing import replay
from topologies import HcclError, ranktable


@pytest.mark.unit
def test_atlas800t_a2_structure():
    t = hccl_sim.topology("atlas800t-a2", servers=2)
    assert (t.num_ranks, t.num_servers, t.device) == (16, 2, "910B")
    kinds = t.links_by_kind()
    assert kinds["HCCS"][0] == 2 * 28 and kinds["RoCE"][0] == 16
    assert kinds["HCCS"][1] == {19.5e9} and kinds["RoCE"][1] == {20.73e9}
    intra, inter = t.route(0, 7), t.route(3, 12)
    # every HCCS peer link has ports of its own: rank 0's towards device 7, rank 7's from device 0
    assert intra.kinds == ("HCCS",) and intra.latency_ns == 600 and intra.egress == (0, "hccs:7")
    assert intra.ingress == (7, "hccs:0") and t.route(0, 6).egress == (0, "hccs:6")
    assert inter.hops == (3, "roce", 12) and inter.latency_ns == 7000 and inter.bandwidth == 20.73e9
    assert inter.egress == (3, "roce") and inter.ingress == (12, "roce")
    assert t.device_model.hbm_bytes == 64 << 30 and t.device_model.staging


@pytest.mark.unit
def test_atlas800_910a_groups():
    t = hccl_sim.topology("atlas800-910a")
    assert t.route(0, 3).kinds == ("HCCS",) and t.route(4, 7).kinds == ("HCCS",)
    assert t.route(1, 6).kinds == ("PCIe", "PCIe")
    assert t.links_by_kind()["HCCS"][0] == 2 * 6


@pytest.mark.unit
def test_synthetic_presets():
    ring = hccl_sim.topology("ring", ranks=6, bandwidth=2e9, latency=1e-6)
    assert ring.graph.number_of_edges() == 6 and ring.route(0, 1).latency_ns == 1000
    assert ring.route(0, 3).latency_ns == 3000   # forwarded around the ring
    mesh = hccl_sim.topology("fullmesh", ranks=5)
    assert mesh.graph.number_of_edges() == 10 and mesh.route(1, 4).egress != mesh.route(1, 3).egress
    assert not mesh.device_model.staging and mesh.device_model.reduce_ns(1 << 20, "float32", "sum") == 0


@pytest.mark.unit
def test_route_errors():
    t = hccl_sim.topology("fullmesh", ranks=3)
    with pytest.raises(HcclError, match="no route to itself"):
        t.route(1, 1)
    with pytest.raises(HcclError, match="ranks must be in"):
        t.route(0, 3)


@pytest.mark.unit
def test_incast_serialises_on_the_receivers_port():
    """Seven senders into one RoCE port take as long as the port needs: 7 x bytes / bandwidth."""
    t = hccl_sim.topology("atlas800t-a2", servers=2)
    n = 20_000_000  # about 1 ms at the RoCE rate
    from topologies.model import transfer_ns
    wire = transfer_ns(n, t.route(0, 8).bandwidth)
    s = Slice("input", 0, 1)
    scheds = [[] for _ in range(16)]
    for r in range(7):
        scheds[r] = [(Send(8, s, n),)]
    scheds[8] = [tuple(Recv(r, s, n) for r in range(7))]
    exits = replay(scheds, [0] * 16, t)
    notify = t.device_model.notify_inter_ns
    assert exits[8] == notify + 7 * wire + 7000
    # one sender alone takes a seventh of that
    single = [[(Send(8, s, n),)]] + [[] for _ in range(7)] + [[(Recv(0, s, n),)]] + [[] for _ in range(7)]
    assert replay(single, [0] * 16, t)[8] == notify + wire + 7000


@pytest.mark.unit
def test_inline_reduce_on_910b():
    t = hccl_sim.topology("atlas800t-a2")
    dm = t.device_model
    assert dm.reduce_ns(1 << 20, "float32", "sum") == 0
    assert dm.reduce_ns(1 << 20, "float32", "prod") > 0 and dm.reduce_ns(1 << 20, "int64", "sum") > 0
    fast = hccl_sim.simulate("allreduce", 64 << 20, topology=t, redop="sum").time
    slow = hccl_sim.simulate("allreduce", 64 << 20, topology=t, redop="prod").time
    assert slow > fast


# ---- rank tables ----------------------------------------------------------------------------------

def table(servers=2, devices=8):
    return ranktable.to_dict(topologies.hardware("atlas800t-a2", devices_per_server=[devices] * servers))


@pytest.mark.unit
def test_ranktable_round_trip(tmp_path):
    t = hccl_sim.topology("atlas800t-a2", servers=3)
    path = tmp_path / "rt.json"
    ranktable.save(t, path)
    back = hccl_sim.topology(str(path))
    assert (back.num_ranks, back.num_servers, back.server_of, back.device_of) == \
           (t.num_ranks, t.num_servers, t.server_of, t.device_of)
    assert ranktable.to_dict(back) == json.loads(path.read_text())


@pytest.mark.local
def test_ranktable_hccl_doc_example():
    doc = {"status": "completed", "version": "1.0", "server_count": "2", "server_list": [
        {"server_id": "node_0", "device": [
            {"device_id": "0", "device_ip": "192.168.1.8", "device_port": "16667", "rank_id": "0"},
            {"device_id": "1", "device_ip": "192.168.1.9", "device_port": "16667", "rank_id": "1"}]},
        {"server_id": "node_1", "device": [
            {"device_id": "0", "device_ip": "192.168.2.8", "device_port": "16667", "rank_id": "2"},
            {"device_id": "1", "device_ip": "192.168.2.9", "device_port": "16667", "rank_id": "3"}]}]}
    t = ranktable.parse(doc)
    assert t.num_ranks == 4 and t.server_of == [0, 0, 1, 1] and t.route(1, 2).kinds == ("RoCE", "RoCE")
    res = hccl_sim.run(lambda c: c.all_reduce(np.ones(3, np.float32) * c.rank), topology=t)
    assert all(np.all(r == 6) for r in res)


@pytest.mark.unit
def test_ranktable_unequal_servers():
    d = table()
    d["server_list"][1]["device"] = d["server_list"][1]["device"][:3]
    t = ranktable.parse(d)
    assert t.num_ranks == 11 and [len(t.ranks_of_server(s)) for s in range(2)] == [8, 3]


def mutate(fn):
    d = table()
    fn(d)
    return d


REJECTIONS = [
    (lambda d: d.update(version="1.1"), "version: unsupported version"),
    (lambda d: d.update(version="1.2"), "missing required field \"super_device_id\""),   # read as A3
    (lambda d: d.update(status="initializing"), "status"),
    (lambda d: d.update(server_count=2), "server_count: must be a JSON string"),
    (lambda d: d.update(server_count="3"), "server_count: says 3"),
    (lambda d: d.update(server_list=[]), "server_list: must be a non-empty"),
    (lambda d: d["server_list"][1].update(server_id="node_0"), r"server_list\[1\].server_id: 'node_0' duplicates"),
    (lambda d: d["server_list"][0]["device"][2].update(rank_id=2), r"device\[2\].rank_id: must be a JSON string"),
    (lambda d: d["server_list"][0]["device"][2].update(rank_id="x"), r"device\[2\].rank_id: must be a decimal"),
    (lambda d: d["server_list"][1]["device"][0].update(rank_id="3"), "duplicates"),
    (lambda d: d["server_list"][0]["device"][1].update(device_id="9"), r"device\[1\].device_id: 9 is out of range"),
    (lambda d: d["server_list"][0]["device"][1].update(device_id="0"), "device_id: 0 duplicates"),
    (lambda d: d["server_list"][0]["device"][1].pop("device_ip"), r'device\[1\]: missing required field "device_ip"'),
    (lambda d: d["server_list"][0]["device"][1].update(device_ip="10.0.0"), "not a dotted IPv4"),
    (lambda d: d["server_list"][0]["device"][1].update(device_ip=d["server_list"][0]["device"][0]["device_ip"]),
     "device_ip: .* duplicates"),
    (lambda d: d["server_list"][0]["device"][1].update(device_port="70000"), "device_port: 70000 is out of range"),
    (lambda d: d["server_list"][0]["device"].pop(), "rank ids must cover"),
]


@pytest.mark.unit
@pytest.mark.parametrize("change,message", REJECTIONS)
def test_ranktable_rejections(change, message):
    with pytest.raises(HcclError, match=message) as info:
        ranktable.parse(mutate(change), path="rt.json")
    assert info.value.code == "E_PARA" and "rank table rt.json" in str(info.value)


@pytest.mark.unit
def test_ranktable_rejects_interleaving():
    """HCCL: server1 {0,1,2,7} / server2 {3,4,5,6} is invalid."""
    d = table(2, 4)
    ids = [["0", "1", "2", "7"], ["3", "4", "5", "6"]]
    for s in range(2):
        for dev, rid in zip(d["server_list"][s]["device"], ids[s]):
            dev["rank_id"] = rid
    with pytest.raises(HcclError, match="not one contiguous run"):
        ranktable.parse(d)


@pytest.mark.unit
def test_ranktable_single_server_needs_no_ip():
    d = table(1, 4)
    for dev in d["server_list"][0]["device"]:
        dev.pop("device_ip")
    assert ranktable.parse(d).num_ranks == 4


@pytest.mark.unit
def test_ranktable_file_errors(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{ not json")
    with pytest.raises(HcclError, match="invalid JSON at line 1"):
        hccl_sim.topology(str(bad))
    with pytest.raises(HcclError, match="cannot read") as info:
        hccl_sim.topology(str(tmp_path / "missing.json"))
    assert info.value.code == "E_OPEN_FILE_FAILURE"
