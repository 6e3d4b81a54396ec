"""`hccl-sim replay`: a recorded step's collectives priced on a bigger cluster, each on its mesh
group's real places with its global bytes; the mesh and trace checked with one-line errors."""
import json

import pytest

import hccl_sim
from hccl_sim.tools import trace_replay as replay
from hccl_sim.tools.cli import main
from topologies.subset import subset

pytestmark = pytest.mark.unit

OPS = [("allgather", 1 << 20, "dp"), ("allreduce", 1 << 16, "tp"), ("reducescatter", 1 << 20, "dp"),
       ("allreduce", 8, "world"), ("isend", 64, "pp"), ("alltoallv", 4096, "tp")]


def _trace(tmp_path, ops=OPS):
    path = tmp_path / "step.json"
    path.write_text(json.dumps({"format": replay.FORMAT, "ranks": 8, "rank": 0, "groups": {"tp": 4, "dp": 2},
                                "ops": [{"op": o, "nbytes": n, "dtype": "float32", "dim": d, "stream": 0,
                                         "after": k - 1} for k, (o, n, d) in enumerate(ops)]}))
    return path


def test_every_op_is_priced_on_its_groups_places_with_its_global_bytes(tmp_path):
    topo = hccl_sim.topology("atlas800t-a2", servers=4)
    mesh = replay.parse_mesh("dp=4,tp=8")
    got = replay.replay(replay.load(_trace(tmp_path)), topo, mesh)
    dp, tp = subset(topo, [0, 8, 16, 24]), subset(topo, list(range(8)))
    want_dp = sum(hccl_sim.simulate(op, n, topology=dp).time for op, n, d in OPS if d == "dp")
    want_tp = hccl_sim.simulate("allreduce", 1 << 16, topology=tp).time + \
        hccl_sim.simulate("alltoall", 4096, topology=tp).time          # a V op as its fixed form
    assert got["per_dim"]["dp"] == (2, pytest.approx(want_dp, rel=0, abs=0))
    assert got["per_dim"]["tp"] == (2, pytest.approx(want_tp, rel=0, abs=0))
    assert got["per_dim"]["world"] == (1, hccl_sim.simulate("allreduce", 8, topology=topo).time)
    assert got["skipped_p2p"] == 1 and got["group_sizes"] == {"dp": 4, "tp": 8, "world": 32}


def test_groups_lay_the_last_dimension_innermost():
    groups = replay.groups_of_rank0(replay.parse_mesh("pp=2,dp=3,tp=4"), 24)
    assert groups["tp"] == [0, 1, 2, 3] and groups["dp"] == [0, 4, 8] and groups["pp"] == [0, 12]


@pytest.mark.parametrize("mesh, ops, message", [
    ("dp=3,tp=8", OPS, "--mesh dp=3,tp=8: 24 ranks, the topology has 32"),
    ("dp=4;tp=8", OPS, "expected NAME=SIZE"),
    ("dp=4,dp=8", OPS, "named twice"),
    ("dp=32", OPS, "mesh dimension 'tp', which --mesh does not name"),
])
def test_bad_meshes_and_traces_are_one_line_errors(tmp_path, capsys, mesh, ops, message):
    code = main(["replay", str(_trace(tmp_path, ops)), "--servers", "4", "--mesh", mesh])
    err = capsys.readouterr().err
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1


def test_the_cli_prints_each_dimension(tmp_path, capsys):
    assert main(["replay", str(_trace(tmp_path)), "--servers", "4", "--mesh", "dp=4,tp=8"]) == 0
    out = capsys.readouterr().out
    assert "on atlas800t-a2 (4 servers, 32 ranks)" in out and "sends/receives not replayed: 1" in out
    (tmp_path / "bad.json").write_text("{}")
    assert main(["replay", str(tmp_path / "bad.json"), "--mesh", "dp=8"]) == 2
