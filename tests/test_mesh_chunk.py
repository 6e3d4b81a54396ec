"""The 950's chunked mesh (algorithms.mesh_chunk: AicpuReduceScatterSoleMeshChunk,
AicpuAllReduceSoleMeshChunkTwoShot): its Latin square of pieces, its programs verified
symbolically on 1..16 ranks and edge sizes, on real data as HCCL's choice, and through HCCL_ALGO's
grammar."""
import numpy as np
import pytest

import hccl_sim
from hccl_sim import collectives
from hccl_sim.algorithms import mesh_chunk
from test_schedules import L, verify


@pytest.mark.unit
@pytest.mark.parametrize("n", [2, 3, 5, 8, 16])
def test_every_piece_reaches_its_owner_from_every_peer_once(n):
    """DoMeshChunk's peers: in a step every rank writes to every other rank, each receiver gets a
    different piece from each sender; over the n - 1 steps each (sender, receiver) pair moves
    every piece once."""
    seen = set()
    for k in range(n - 1):
        r, i, f = mesh_chunk.peers(n, k)
        assert (f != r).all()
        for rank in range(n):
            assert sorted(f[r == rank].tolist()) == [x for x in range(n) if x != rank]
            assert sorted(i[f == rank].tolist()) == list(range(n - 1))         # a Latin square
        seen |= set(zip(r.tolist(), f.tolist(), i.tolist()))
    assert len(seen) == n * (n - 1) * (n - 1)


@pytest.mark.unit
def test_a_blocks_pieces_are_aligned_as_hccl_aligns_them():
    """RunReduceScatter: D / (n - 1) aligned down to 4,096 bytes, the last piece the rest; below
    that (or on 2 ranks) the count split evenly, the larger pieces first."""
    piece = (4 << 20) // 7 // 4096 * 4096 // 4                    # 598,016 bytes: 149,504 elements
    assert mesh_chunk.block_cuts(1 << 20, 8, 4).tolist() == [k * piece for k in range(7)] + [1 << 20]
    assert mesh_chunk.block_cuts(100, 8, 4).tolist() == [0, 15, 30, 44, 58, 72, 86, 100]
    assert mesh_chunk.block_cuts(7, 2, 4).tolist() == [0, 7]


@pytest.mark.unit
def test_programs_on_every_rank_count_and_edge_sizes():
    for p in range(1, 17):
        for n in (1, p - 1, p, 3 * p + 1, 1000):
            if n:
                verify(mesh_chunk.allreduce(p, n, 4), "allreduce", p, n, 0, f"allreduce p={p} n={n}")
        for length, itemsize in ((1, 4), (p, 4), (5000, 4), (70000, 2)):
            parts = mesh_chunk.block_parts(p, length, itemsize)
            assert parts[0][0] == 0 and parts[-1][1] == length
            assert all(a[1] == b[0] for a, b in zip(parts, parts[1:]))
            for lo, hi, program in parts:
                verify(program, "reducescatter", p, L, 0, f"reducescatter p={p} {length} [{lo}, {hi})")


@pytest.mark.unit
def test_it_is_hccls_choice_for_large_data_on_a_server():
    """SelectMeshAlgoAicpu: a ReduceScatter over 16 MiB a rank's output on 8 ranks, an AllReduce over
    32 MiB x (n/8)^2 (256 MiB on 8 ranks)."""
    topo = hccl_sim.topology("atlas950")
    assert hccl_sim.simulate("reducescatter", 8 * (17 << 20), topology=topo).algo == \
        "AicpuReduceScatterSoleMeshChunk: mesh_chunk"
    assert hccl_sim.simulate("allreduce", 512 << 20, topology=topo).algo == \
        "AicpuAllReduceSoleMeshChunkTwoShot: mesh_chunk"


@pytest.mark.local
@pytest.mark.parametrize("op,count,algo", [("reducescatter", 5000, "reducescatter:sole{meshchunk}"),
                                           ("allreduce", 300_001, "allreduce:sole{meshchunktwoshot}")])
def test_real_data(op, count, algo):
    """A whole 950 server, the chunked mesh asked for by HCCL_ALGO (HCCL picks it only for hundreds
    of MiB): int32 data bit-identical to numpy, in one loop and in several (a 1 MB CCL buffer)."""
    topo = hccl_sim.topology("atlas950")
    p = topo.num_ranks
    inputs = [(np.arange(count * (p if op == "reducescatter" else 1), dtype=np.int32) * (r + 3) + r) % 997
              for r in range(p)]

    def fn(comm):
        x = inputs[comm.rank]
        return (comm.reduce_scatter(x) if op == "reducescatter" else comm.all_reduce(x)), comm.last_op
    for env in ({"HCCL_ALGO": algo}, {"HCCL_ALGO": algo, "HCCL_BUFFSIZE": "1"}):
        results = hccl_sim.run(fn, topology=topo, env=env)
        for r, ((got, last), want) in enumerate(zip(results, collectives.of(op).reference(inputs, "sum"))):
            assert np.array_equal(got, want), f"{op} rank {r} {env}"
            assert last.algo.startswith(("AicpuReduceScatterSoleMeshChunk: mesh_chunk",
                                         "AicpuAllReduceSoleMeshChunkTwoShot: mesh_chunk"))


@pytest.mark.unit
def test_hccl_algo_names_it_and_allgather_has_none():
    """`sole{meshchunk}` runs it for a ReduceScatter (HCCL registers AicpuReduceScatterSoleMeshChunk);
    HCCL registers no AicpuAllGatherSoleMeshChunk, so an AllGather that asks for it is refused."""
    topo = hccl_sim.topology("atlas950")
    est = hccl_sim.simulate("reducescatter", 8 << 20, topology=topo, env={"HCCL_ALGO": "reducescatter:sole{meshchunk}"})
    assert est.algo.startswith("AicpuReduceScatterSoleMeshChunk: mesh_chunk")
    with pytest.raises(hccl_sim.HcclError):
        hccl_sim.simulate("allgather", 8 << 20, topology=topo, env={"HCCL_ALGO": "allgather:sole{meshchunk}"})
