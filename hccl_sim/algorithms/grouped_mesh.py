"""Grouped full mesh: HCCL's AlltoAll on A3 (hcomm alltoallv_direct_fullmesh.cc, CollRunAlltoAllDirectFullmesh;
algo_intro.md "分组Full Mesh": high concurrency inside the superpod, low between superpods, against incast).

Level0 and level1 flattened into one full mesh over every rank. Inside a rank's SDMA group (its
superpod; its server when HCCL_INTER_HCCS_DISABLE puts RoCE between servers) it exchanges with 8
peers at a time (ALLTOALLV_DIRECT_FULLMESH_SDMA_CONCURRENT_SIZE), nearest first: distances +1, -1,
+2, -2, ... (4 left and 4 right per round). With the ranks of the other groups it exchanges one
peer at a time (RDMA concurrency 1) on its own stream, alongside the SDMA rounds: in step k rank
(group g, index i) sends to (group g + 1 + k // G, index i + k) of the G-rank groups, a shift
permutation, so no rank ever receives from two remote senders at once (HCCL's ProcessRdmaData
walks the same peers one per round). Its own block is a local copy.

Steps: max(ceil((G - 1) / 8), p - G). Groups must be of equal size (the superpods of an equal
decomposition); rows: input row j goes to rank j, output row j comes from rank j.
"""
from __future__ import annotations

import numpy as np

from .common import INPUT, OUTPUT, StepBuilder

NAME = "grouped_fullmesh"
COLLECTIVES = ("alltoall",)
LEVELS = ()                           # no level a token can ask for: only HCCL's A3 selection runs it
DESCRIPTION = "A3 AlltoAll: 8 concurrent SDMA peers inside the superpod, one RDMA peer at a time across"
SDMA_CONCURRENT = 8


def sdma_distances(G: int) -> list:
    """Distances within a group in HCCL's order: +1, -1, +2, -2, ... (each peer once)."""
    out, seen = [], set()
    for i in range(1, G):
        for d in (i % G, (-i) % G):
            if d and d not in seen:
                seen.add(d)
                out.append(d)
    return out


def alltoall(group_of, unit: int, src=INPUT, dst=OUTPUT) -> list:
    group_of = np.asarray(group_of, dtype=np.int64)
    p = len(group_of)
    members, g_of, i_of, G, groups = _groups(group_of)      # members[g, i]: rank i of group g
    r = np.arange(p)
    dist = sdma_distances(G)
    rounds = [dist[k:k + SDMA_CONCURRENT] for k in range(0, len(dist), SDMA_CONCURRENT)]
    remote = p - G
    steps = []
    for k in range(max(len(rounds), remote, 1)):
        b = StepBuilder()
        if k == 0:
            b.copies(r, unit, src, r, r + 1, dst, r)
        for d in (rounds[k] if k < len(rounds) else ()):
            to = members[g_of, (i_of + d) % G]
            b.transfers(r, to, unit, src, to, to + 1, dst, r)
        if k < remote:
            to = members[(g_of + 1 + k // G) % groups, (i_of + k) % G]
            b.transfers(r, to, unit, src, to, to + 1, dst, r)
        steps.append(b.build())
    return steps


def alltoallv(group_of, blocks, itemsize: int, src=INPUT, dst=OUTPUT) -> list:
    """The grouped full mesh with a count per pair (what alltoallv_direct_fullmesh.cc is written
    for): the same peers in the same rounds, each pair moving its own block; `blocks` as
    pairwise.alltoallv's. A pair with nothing to move has no transfer."""
    lengths, soff, doff = blocks
    group_of = np.asarray(group_of, dtype=np.int64)
    p = len(group_of)
    members, g_of, i_of, G, groups = _groups(group_of)
    r = np.arange(p)
    dist = sdma_distances(G)
    rounds = [dist[k:k + SDMA_CONCURRENT] for k in range(0, len(dist), SDMA_CONCURRENT)]
    remote = p - G
    steps = []

    def send(b, to):
        length = lengths[r, to]
        go = length > 0
        b.transfers(r[go], to[go], itemsize, src, soff[r, to][go], (soff[r, to] + length)[go], dst, doff[r, to][go])
    for k in range(max(len(rounds), remote, 1)):
        b = StepBuilder()
        if k == 0:
            own = lengths[r, r] > 0
            b.copies(r[own], itemsize, src, soff[r, r][own], (soff[r, r] + lengths[r, r])[own], dst, doff[r, r][own])
        for d in (rounds[k] if k < len(rounds) else ()):
            send(b, members[g_of, (i_of + d) % G])
        if k < remote:
            send(b, members[(g_of + 1 + k // G) % groups, (i_of + k) % G])
        steps.append(b.build())
    return steps


def _groups(group_of):
    """(members[g, i], every rank's group, its index in it, group size, groups)."""
    p = len(group_of)
    ranks = np.argsort(group_of, kind="stable")
    groups = int(group_of.max()) + 1 if p else 0
    G = p // groups if groups else 0
    members = ranks.reshape(groups, G)
    g_of = np.empty(p, dtype=np.int64)
    i_of = np.empty(p, dtype=np.int64)
    g_of[members.reshape(-1)] = np.repeat(np.arange(groups), G)
    i_of[members.reshape(-1)] = np.tile(np.arange(G), groups)
    return members, g_of, i_of, G, groups
