"""The fixed-size collectives (one count per rank): AllReduce, Broadcast, Reduce, AllGather,
ReduceScatter, AlltoAll, Scatter, and the Barrier, which carries no data. Each class says what its
collective is (hccl_sim.collectives.base) and which algorithms build its programs on each level.
"""
from __future__ import annotations

import numpy as np

from . import verifiable as vf
from .base import Collective, Loops
from .. import algorithms
from ..algorithms import birs, grouped_mesh, hierarchy, mesh_rounds, pipeline, superpod
from ..algorithms.common import INPUT, OUTPUT, SCRATCH, one_row_each, relabel_rows, tile
from ..config.types import ReduceOp, reducer


# The most ranks hccl_sim.simulate prices an AlltoAll on: its p(p-1) blocks are priced one by one
# (hccl_sim.MAX_ALLTOALL_RANKS re-exports it); the 950's rounds of 16 peers, built a step at a
# time, go to mesh_rounds.MAX_RANKS.
MAX_ALLTOALL_RANKS = 2048


def _reduce_all(inputs, redop):
    acc = np.array(inputs[0], copy=True)
    fn = reducer(redop or ReduceOp.SUM)
    for x in inputs[1:]:
        fn(x, acc, acc)
    return acc


class AllReduce(Collective):
    name, method, reducing = "allreduce", "all_reduce", True

    def server_program(self, srv, length, unit, root, l0, l1):
        return hierarchy.allreduce(srv, length, unit, l0, l1)

    def pipeline_program(self, srv, length, unit):
        return pipeline.allreduce(srv, length, unit)

    def superpod_program(self, pods, choice, length, unit, root, ring_index):
        return superpod.allreduce(pods, length, unit, *self.superpod_levels(choice), ring_index,
                                  l0=choice.level0)

    def busbw_factor(self, p):
        return 2 * (p - 1) / p

    def verifiable(self, rank, p, count, dtype, redop="sum", root=0):
        return vf.reduced(np.arange(count), p, dtype, redop)

    def reference(self, inputs, redop=None, root=0):
        total = _reduce_all(inputs, redop)
        return [total.copy() for _ in inputs]


    def stage_bytes(self, p, length, itemsize, root):
        # traced: its own 1/p block copied in at the start, and 1/p between the reduce-scatter and
        # the allgather phases (0.39 + 0.41 ms of a 29.65 ms 2 GiB op on 8 NPUs)
        own = np.full(p, -(-length // p) * itemsize, dtype=np.int64)
        return own, own.copy()

class Broadcast(Collective):
    name, method, rooted = "broadcast", "broadcast", True

    def server_program(self, srv, length, unit, root, l0, l1):
        return hierarchy.broadcast(srv, length, unit, root, l0, l1)

    def superpod_program(self, pods, choice, length, unit, root, ring_index):
        # the 950's Parallel executor scatters and gathers with NHR whatever the size (no tree)
        return superpod.broadcast(pods, length, unit, root, *self.superpod_levels(choice), ring_index,
                                  oneshot=False if choice.split is not None else None, l0=choice.level0)

    def stage_bytes(self, p, length, itemsize, root):
        # traced: the root copies the whole buffer in (3.17 ms of 2 GiB), every other rank copies
        # it out at the end (3.22 ms)
        ins, outs = np.zeros(p, dtype=np.int64), np.full(p, length * itemsize, dtype=np.int64)
        ins[root], outs[root] = length * itemsize, 0
        return ins, outs

    def verifiable(self, rank, p, count, dtype, redop="sum", root=0):
        return vf.values(np.arange(count), root, dtype, redop)

    def reference(self, inputs, redop=None, root=0):
        return [np.array(inputs[root], copy=True) for _ in inputs]


class Reduce(Collective):
    name, method, reducing, rooted = "reduce", "reduce", True, True

    def server_program(self, srv, length, unit, root, l0, l1):
        return hierarchy.reduce(srv, length, unit, root, l0, l1)

    def superpod_program(self, pods, choice, length, unit, root, ring_index):
        if choice.split is not None:
            # the 950's Parallel executor (ReduceParallelExecutor) runs a whole parallel AllReduce,
            # the root keeping its result (docs/references.md §6.13)
            return superpod.allreduce(pods, length, unit, *self.superpod_levels(choice), ring_index, l0=choice.level0)
        return superpod.reduce(pods, length, unit, root, *self.superpod_levels(choice), ring_index,
                               l0=choice.level0)

    def result(self, out, rank, root):
        return out if rank == root else None

    def stage_bytes(self, p, length, itemsize, root):
        # traced: every rank copies the whole buffer in (3.19 ms of 2 GiB) and 1/p between the
        # reduce-scatter and the gather; the root also copies the whole result out (3.19 ms)
        ins = np.full(p, length * itemsize, dtype=np.int64)
        outs = np.full(p, -(-length // p) * itemsize, dtype=np.int64)
        outs[root] += length * itemsize
        return ins, outs

    def verifiable(self, rank, p, count, dtype, redop="sum", root=0):
        return vf.reduced(np.arange(count), p, dtype, redop) if rank == root else None

    def reference(self, inputs, redop=None, root=0):
        total = _reduce_all(inputs, redop)
        return [total if r == root else None for r in range(len(inputs))]


class AllGather(Collective):
    name, method, block, min_ndim = "allgather", "all_gather", True, 1
    rank_rows = OUTPUT               # row r of the output is rank r's block
    input_is_block = True

    def server_program(self, srv, length, unit, root, l0, l1):
        return hierarchy.allgather(srv, unit, l0, l1)

    def pipeline_program(self, srv, length, unit):
        return pipeline.allgather(srv, unit)

    def superpod_program(self, pods, choice, length, unit, root, ring_index):
        return superpod.allgather(pods, unit, *self.superpod_levels(choice), ring_index, l0=choice.level0)

    def output_shape(self, shape, p):
        return (p * shape[0],) + tuple(shape[1:])

    def op_bytes(self, count, p, itemsize):
        return count * itemsize * p          # nccl-tests: the whole gathered output

    def input_shape_for_bytes(self, nbytes, p, itemsize):
        return (self.count_for_bytes(nbytes, p, itemsize) // p,)

    def busbw_factor(self, p):
        return (p - 1) / p

    def layout(self, p):
        return (1, p, None)

    def stage_bytes(self, p, length, itemsize, root):
        # traced: the input (its own block) copied in; the copy of its own block into its output
        # runs during the link phase, which takes longer (0.41 ms of a 14.36 ms 2 GiB op)
        return np.full(p, length * itemsize, dtype=np.int64), np.zeros(p, dtype=np.int64)

    def verifiable(self, rank, p, count, dtype, redop="sum", root=0):
        return np.concatenate([vf.values(np.arange(count), r, dtype, redop) for r in range(p)]) if p else None

    def reference(self, inputs, redop=None, root=0):
        total = np.concatenate(inputs, axis=0)
        return [total.copy() for _ in inputs]


class ReduceScatter(Collective):
    name, method, block, reducing = "reducescatter", "reduce_scatter", True, True
    rank_rows = INPUT                # row r of the input is rank r's block
    min_ndim, divisible, has_scratch = 1, True, True

    def server_program(self, srv, length, unit, root, l0, l1):
        return hierarchy.reducescatter(srv, unit, l0, l1)

    def pipeline_program(self, srv, length, unit):
        return pipeline.reducescatter(srv, unit)

    def superpod_program(self, pods, choice, length, unit, root, ring_index):
        return superpod.reducescatter(pods, unit, *self.superpod_levels(choice), ring_index, l0=choice.level0)

    def program(self, choice, view, length, unit, root):
        if choice.flat and choice.level1 == birs.NAME:       # HCCL_BIRS_ENABLE: its own layout on the servers
            return birs.reducescatter(view.p, view.servers.m, unit)
        return super().program(choice, view, length, unit, root)

    def output_shape(self, shape, p):
        return (shape[0] // p,) + tuple(shape[1:])

    def busbw_factor(self, p):
        return (p - 1) / p

    def group_volume(self, nbytes, p):
        return nbytes // max(p, 1)             # its output's bytes

    def layout(self, p):
        return (p, 1, p)

    def stage_bytes(self, p, length, itemsize, root):
        # traced: one block (1/p of the input) copied in and its reduced block copied out
        # (0.40 + 0.40 ms of a 15.76 ms 2 GiB op on 8 NPUs)
        own = np.full(p, length * itemsize, dtype=np.int64)
        return own, own.copy()

    def verifiable(self, rank, p, count, dtype, redop="sum", root=0):
        m = count // p
        return vf.reduced(np.arange(rank * m, (rank + 1) * m), p, dtype, redop)

    def reference(self, inputs, redop=None, root=0):
        total = _reduce_all(inputs, redop)
        return list(np.split(total, len(inputs), axis=0))


class AllToAll(Collective):
    name, method, block = "alltoall", "all_to_all", True
    min_ndim, divisible, has_scratch = 1, True, True
    # p(p-1) blocks move one by one on real data (512 ranks: 3 s here; 1,024: 28 s);
    # hccl_sim.simulate prices larger ones without payload
    max_ranks_with_data = 512
    max_ranks_priced = mesh_rounds.MAX_RANKS          # the most any of its programs is priced on
    max_ranks_priced_why = "(algorithms.mesh_rounds.MAX_RANKS): its p(p-1) blocks are priced one by one"
    # HCCL's A3 AlltoAll is the grouped full mesh: no double ring
    double_ring = False

    def server_program(self, srv, length, unit, root, l0, l1):
        return hierarchy.alltoall(srv, unit)          # HCCL's staged AlltoAll, whatever the levels

    def grouped_program(self, group_of, unit):
        return grouped_mesh.alltoall(group_of, unit)

    def priced_choice_problem(self, p, choice):
        # the 950's rounds of 16 peers are built a step at a time (mesh_rounds.MAX_RANKS); every
        # other program holds its p(p-1) blocks at once (a one-step mesh's would not fit in memory)
        if p <= MAX_ALLTOALL_RANKS or (choice.flat and choice.level1 == mesh_rounds.NAME):
            return None
        return (f"{p} ranks are over the limit of {MAX_ALLTOALL_RANKS} (hccl_sim.MAX_ALLTOALL_RANKS) for "
                f"{choice.label}: its p(p-1) blocks are priced one by one (the 950's rounds of 16 peers go "
                f"to {mesh_rounds.MAX_RANKS})")

    def busbw_factor(self, p):
        return (p - 1) / p

    def layout(self, p):
        return (p, p, p)

    def stage_bytes(self, p, length, itemsize, root):
        # traced: the whole send buffer copied in (3.21 ms of 2 GiB), and its own block into the
        # output (0.40 ms)
        return (np.full(p, p * length * itemsize, dtype=np.int64), np.full(p, length * itemsize, dtype=np.int64))

    def verifiable(self, rank, p, count, dtype, redop="sum", root=0):
        m = count // p              # block `rank` of every source rank, in source order
        return np.concatenate([vf.values(np.arange(rank * m, (rank + 1) * m), src, dtype, redop) for src in range(p)])

    def reference(self, inputs, redop=None, root=0):
        p = len(inputs)
        blocks = [np.split(x, p, axis=0) for x in inputs]
        return [np.concatenate([blocks[src][dst] for src in range(p)], axis=0) for dst in range(p)]


class Scatter(Collective):
    """HcclScatter: block j of the root's x (x.shape[0] divisible by the rank count) goes to rank j;
    every rank gives an x of that shape (the root's is read)."""
    name, method, block, rooted = "scatter", "scatter", True, True
    min_ndim, divisible, has_scratch = 1, True, True
    double_ring = False             # HCCL's A3 Scatter runs one ring inside each server

    def program(self, choice, view, length, unit, root):
        if choice.flat:
            return super().program(choice, view, length, unit, root)
        # level0 and level1 of HCCL's Scatter executors, A3's too (level1 over every server)
        return hierarchy.scatter(view.servers, unit, root, choice.level0 or "fullmesh", choice.level1 or "ring")

    def superpod_program(self, pods, choice, length, unit, root, ring_index):
        # a part of the 950's Parallel executor (its levels as `pods` arrange the ranks: the
        # transposed view scatters in the root's server first); built on the ranks in the view's
        # order, then moved to theirs: ranks, and the rows of the root's input and the relays
        if pods.N2 > 1:
            raise self._no("across SuperPoDs in parts")        # HCCL runs it on one SuperPoD's two levels
        order = pods.M.reshape(-1)
        view = hierarchy.Servers(np.arange(len(order)) // pods.N0)
        at = int(np.flatnonzero(order == root)[0])
        program = tile(hierarchy.scatter(view, unit, at, choice.level0, choice.level1), order[None, :])
        if pods.canonical:
            return program
        # a server's region of the transposed view is one rank of every server: row by row
        return relabel_rows(relabel_rows(one_row_each(program), INPUT, order), SCRATCH, order)

    def output_shape(self, shape, p):
        return (shape[0] // p,) + tuple(shape[1:])

    def busbw_factor(self, p):
        return (p - 1) / p                     # nccl-tests' scatter_perf

    def group_volume(self, nbytes, p):
        return nbytes // max(p, 1)             # its output's bytes (calcOpDataVolume: recvCount)

    def layout(self, p):
        return (p, 1, p)

    def stage_bytes(self, p, length, itemsize, root):
        # coll_scatter_executor.cc RunLoopInner: the root copies the loop's p slices into the CCL
        # buffer; every rank copies its slice within it (ScatterMesh's resultMem) and out to its
        # output (no trace of a Scatter is published)
        block = length * itemsize
        ins, outs = np.zeros(p, dtype=np.int64), np.full(p, 2 * block, dtype=np.int64)
        ins[root] = p * block
        return ins, outs

    def verifiable(self, rank, p, count, dtype, redop="sum", root=0):
        m = count // p
        return vf.values(np.arange(rank * m, (rank + 1) * m), root, dtype, redop)

    def reference(self, inputs, redop=None, root=0):
        return [b.copy() for b in np.split(inputs[root], len(inputs), axis=0)]


class Barrier(Collective):
    """No data: every rank leaves once all have arrived."""
    name, method, carries_data = "barrier", "barrier", False
    releases_together, double_ring = True, False

    def program(self, choice, view, length, unit, root):
        # HCCL's barrier is a tiny AllReduce; modelled as the dissemination barrier on every topology
        return algorithms.flat_program(self.name, "dissemination", view.p, 0, 0)

    def loops(self, count, p, itemsize, buffsize):
        return Loops(1, 1)          # one (empty) program

    def stage_bytes(self, p, length, itemsize, root):
        zero = np.zeros(p, dtype=np.int64)
        return zero, zero.copy()

    def verifiable(self, rank, p, count, dtype, redop="sum", root=0):
        return None

    def reference(self, inputs, redop=None, root=0):
        return [None for _ in inputs]
