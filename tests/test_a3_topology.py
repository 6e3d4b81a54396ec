"""The Atlas 900 A3 SuperPoD topology: 910C dies as ranks, SIO inside a package, the superpod's UB
fabric, RoCE between superpods; its HCCL rank tables (version 1.2); send/recv (the collectives: test_superpod.py)."""
import json

import numpy as np
import pytest

import hccl_sim
from topologies import HcclError, ranktable


@pytest.mark.unit
def test_superpods_of_unequal_server_counts():
    t = hccl_sim.topology("atlas900-a3", superpods=3, servers=[1, 3, 2])
    assert (t.num_ranks, t.num_servers, t.device) == (96, 6, "910C")
    assert t.params["superpod_of_server"] == [0, 1, 1, 1, 2, 2] and t.params["superpods"] == 3
    assert t.links_by_kind() == {"SIO": (48, {158.8e9}), "HCCS": (96, {125.3e9}), "RoCE": (96, {23.05e9})}
    one = hccl_sim.topology("atlas900-a3")
    assert one.num_ranks == 16 and "RoCE" not in one.links_by_kind()      # one superpod: no RoCE fabric
    assert "superpods  : 3 (servers each: [1, 3, 2])" in t.summary()


@pytest.mark.unit
def test_routes_sio_ub_roce():
    t = hccl_sim.topology("atlas900-a3", superpods=2, servers=2)        # ranks 0-31 pod 0, 32-63 pod 1
    sio, in_server, in_pod, across = t.route(4, 5), t.route(4, 6), t.route(4, 20), t.route(4, 40)
    assert sio.kinds == ("SIO",) and sio.egress == (4, "sio") and sio.bandwidth == 158.8e9 and sio.latency_ns == 600
    assert in_server.hops == (4, "ub:0", 6) and in_server.kinds == ("HCCS", "HCCS") and in_server.bandwidth == 125.3e9
    assert in_pod.hops == (4, "ub:0", 20) and in_pod.egress == in_server.egress == (4, "ub")   # one UB port per die
    assert across.hops == (4, "roce", 40) and across.latency_ns == 7000 and across.bandwidth == 23.05e9
    assert t.route(33, 60).hops == (33, "ub:1", 60)
    # the vectorised routes agree with the scalar ones, and share a port exactly when the names do
    rng = np.random.default_rng(3)
    src = rng.integers(0, 64, 400)
    dst = (src + rng.integers(1, 64, 400)) % 64
    lat, bw, pbw, eport, iport = t.route_arrays(src, dst)
    names_e, names_i = {}, {}
    for k, (a, b) in enumerate(zip(src.tolist(), dst.tolist())):
        r = t.route(a, b)
        assert (lat[k], bw[k], pbw[k]) == (r.latency_ns, r.bandwidth, r.port_bandwidth)
        assert names_e.setdefault(r.egress, eport[k]) == eport[k] and names_i.setdefault(r.ingress, iport[k]) == iport[k]
    assert len(set(names_e.values())) == len(names_e) and len(set(names_i.values())) == len(names_i)


@pytest.mark.unit
@pytest.mark.parametrize("params,match", [
    ({"superpods": 2, "servers": [1]}, "gives 1 superpods' server counts for superpods=2"),
    ({"superpods": 0}, "superpods"),
    ({"superpods": True}, "superpods"),
    ({"servers": [2, 0], "superpods": 2}, "servers"),
    ({"superpods": 8192, "servers": 8192}, "8192 superpods x servers=8192 make 67108864 servers, over the limit"),
])
def test_bad_superpod_parameters(params, match):
    with pytest.raises(HcclError, match=match):
        hccl_sim.topology("atlas900-a3", **params)


@pytest.mark.unit
def test_superpods_are_a_superpod_preset_notion():
    with pytest.raises(HcclError, match="unknown parameter"):
        hccl_sim.topology("atlas800t-a2", superpods=2)
    from topologies.presets import hardware
    with pytest.raises(HcclError, match="superpods are a SuperPoD preset.s notion"):
        hardware("atlas800t-a2", superpods=2)


@pytest.mark.unit
def test_rank_table_version_1_2_round_trip(tmp_path):
    t = hccl_sim.topology("atlas900-a3", superpods=2, servers=[2, 1])
    table = ranktable.to_dict(t)
    assert table["version"] == "1.2"
    assert [len(p["server_list"]) for p in table["super_pod_list"]] == [2, 1]
    assert all("super_device_id" in d for s in table["server_list"] for d in s["device"])
    path = tmp_path / "a3.json"
    path.write_text(json.dumps(table))
    back = hccl_sim.topology(str(path))                      # a 1.2 table is read as atlas900-a3 servers
    assert back.device == "910C" and back.params["superpod_of_server"] == [0, 0, 1]
    assert back.route(0, 40).kinds == ("RoCE", "RoCE") and back.route(0, 20).kinds == ("HCCS", "HCCS")
    assert ranktable.to_dict(back)["super_pod_list"] == table["super_pod_list"]


def _a3_table():
    return ranktable.to_dict(hccl_sim.topology("atlas900-a3", superpods=2, servers=[2, 1]))


def _edit(fn):
    table = _a3_table()
    fn(table)
    return table


@pytest.mark.unit
@pytest.mark.parametrize("edit,match", [
    (lambda t: t.pop("super_pod_list"), "super_pod_list: must be a non-empty JSON array"),
    (lambda t: t["server_list"][0]["device"][3].pop("super_device_id"), 'missing required field "super_device_id"'),
    (lambda t: t["server_list"][0]["device"][3].update(super_device_id=t["server_list"][0]["device"][4]
                                                      ["super_device_id"]), "duplicates rank"),
    (lambda t: t["super_pod_list"][1]["server_list"].append({"server_id": "node_0"}), "already in superpod"),
    (lambda t: t["super_pod_list"][0]["server_list"].pop(), "are in no superpod"),
    (lambda t: t["super_pod_list"][1]["server_list"].append({"server_id": "node_9"}), "is not in server_list"),
    (lambda t: t["super_pod_list"].__setitem__(1, {"super_pod_id": "0", "server_list": [{"server_id": "node_2"}]}),
     "duplicates super_pod_list"),
    (lambda t: (t["super_pod_list"][0]["server_list"].pop(0),
                t["super_pod_list"][1]["server_list"].append({"server_id": "node_0"})), "not contiguous"),
])
def test_bad_version_1_2_tables(edit, match):
    with pytest.raises(HcclError, match=match):
        ranktable.parse(_edit(edit))


@pytest.mark.unit
def test_table_version_and_preset_must_agree():
    with pytest.raises(HcclError, match="describes A3 superpod servers, not atlas800t-a2"):
        ranktable.parse(_a3_table(), preset="atlas800t-a2")
    a2 = ranktable.to_dict(hccl_sim.topology("atlas800t-a2", servers=2))
    with pytest.raises(HcclError, match="describes A2/910A servers, not atlas900-a3"):
        ranktable.parse(a2, preset="atlas900-a3")


@pytest.mark.local
def test_send_recv_across_superpods():
    t = hccl_sim.topology("atlas900-a3", superpods=2, servers=1)

    def fn(comm):
        if comm.rank == 3:
            comm.send(np.arange(6, dtype=np.int32), dst=20)           # across superpods
        if comm.rank == 20:
            got = comm.recv(3)
            return got.tolist(), comm.last_op.time
    got, seconds = hccl_sim.run(fn, topology=t)[20]
    dm = t.device_model
    assert got == list(range(6)) and seconds > (dm.p2p_overhead_ns + 7000) / 1e9
