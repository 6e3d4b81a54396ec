"""Run one rank's schedule on real buffers over a transport (the per-rank executor).

Per step:
1. post every Send (a view of this rank's registered memory);
2. run the step's local copies (copies run at the start of their step, as in the serial data
   program: hcomm.program.data_moves);
3. take every Recv in order and copy or reduce straight from the sender's memory, then
   acknowledge it;
4. wait until this rank's own sends have been consumed: only then may the next step write.
"""
from __future__ import annotations

import numpy as np

from .steps import Copy, Recv, Send


def execute(schedule, rank: int, transport, tag, reduce_fn, deadline=None, op: str | None = None) -> None:
    """Execute `schedule` for `rank`; buffers must be registered on the transport beforehand."""
    region = transport.region
    for step in schedule:
        posted = []
        for item in step:
            if type(item) is Send:
                s = item.src
                posted.append(transport.post(rank, item.peer, tag, s.buf, s.start, s.stop))
        for item in step:
            if type(item) is Copy:
                s, d = item.src, item.dst
                np.copyto(region(rank, d.buf)[d.start:d.stop], region(rank, s.buf)[s.start:s.stop])
        for item in step:
            if type(item) is Recv:
                msg = transport.take(item.peer, rank, tag, deadline, op)
                d = item.dst
                out = region(rank, d.buf)[d.start:d.stop]
                if item.reduce_with is None:
                    np.copyto(out, msg.data)
                else:
                    w = item.reduce_with
                    reduce_fn(msg.data, region(rank, w.buf)[w.start:w.stop], out)
                msg.consumed()
        for msg in posted:
            transport.wait_consumed(msg, deadline, op)
