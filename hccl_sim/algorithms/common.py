"""Helpers shared by the schedule builders: chunk boundaries, buffer slices, and the
non-power-of-two fold used by recursive halving-doubling."""
from __future__ import annotations

from hcomm.steps import Copy, Slice

INPUT, OUTPUT, SCRATCH = "input", "output", "scratch"


def bounds(n: int, parts: int) -> list:
    """Boundaries splitting n units into `parts` contiguous chunks whose sizes differ by at most one."""
    return [(i * n) // parts for i in range(parts + 1)]


def sl(buf: str, start: int, stop: int) -> Slice:
    return Slice(buf, start, stop)


def local_copy(n: int, unit: int) -> list:
    """The whole schedule of a one-rank collective: output = input."""
    return [(Copy(sl(INPUT, 0, n), sl(OUTPUT, 0, n), n * unit),)] if n else []


def fold(p: int):
    """HCCL's RHD fold for p ranks (RHD.md): (block, rem) with block = 2^floor(log2 p), rem = p - block.

    The first 2*rem ranks pair up: odd rank r hands its data to r-1 and idles; even rank r takes
    virtual rank r/2. Ranks >= 2*rem take virtual rank r - rem.
    """
    block = 1 << (p.bit_length() - 1)
    return block, p - block


def virtual_rank(rank: int, rem: int):
    """Virtual rank inside the power-of-two block, or None for an odd rank folded into rank-1."""
    if rank < 2 * rem:
        return None if rank % 2 else rank // 2
    return rank - rem


def real_rank(v: int, rem: int) -> int:
    return 2 * v if v < rem else v + rem


def first_block(v: int, rem: int) -> int:
    """First real rank block owned by virtual rank v (v < rem owns two blocks: its pair's)."""
    return 2 * v if v < rem else v + rem
