"""The central executor runs an index-aligned flat share a piece at a time (hcomm.exec.central:
every move on one piece before the next, so moves meeting in one place find it in the cache). Each
element still sees its moves in the serial order: float results are bit-identical to running the
share whole, for every algorithm and op that runs there, with pieces smaller than a block."""
import numpy as np
import pytest

import hccl_sim
from hcomm.exec import central

pytestmark = pytest.mark.local


def _results(topo, op, algo, n):
    p = topo.num_ranks
    rng = np.random.default_rng(7)
    inputs = [rng.standard_normal(n).astype(np.float32) for _ in range(p)]

    def fn(comm):
        x = inputs[comm.rank]
        if op == "allreduce":
            return comm.all_reduce(x, algo=algo)
        if op == "broadcast":
            return comm.broadcast(x, root=p - 1, algo=algo)
        return comm.reduce(x, root=1, algo=algo)
    return hccl_sim.run(fn, topology=topo)


@pytest.mark.parametrize("op,algo", [("allreduce", "ring"), ("allreduce", "fullmesh"), ("allreduce", "NHR"),
                                     ("allreduce", "H-D_R"), ("broadcast", "ring"), ("reduce", "fullmesh")])
def test_pieces_give_the_bits_of_whole_shares(monkeypatch, op, algo):
    topo = hccl_sim.topology("fullmesh", ranks=5)
    n = 4099                                     # 16 KiB a rank, blocks of ~3.3 KiB: many pieces a block
    monkeypatch.setattr(central, "CHUNK_BYTES", 1 << 40)
    whole = _results(topo, op, algo, n)
    monkeypatch.setattr(central, "CHUNK_BYTES", 200)    # 50 elements a piece
    pieces = _results(topo, op, algo, n)
    for r, (a, b) in enumerate(zip(whole, pieces)):
        assert (a is None and b is None) or a.tobytes() == b.tobytes(), f"{op} {algo} rank {r}"
