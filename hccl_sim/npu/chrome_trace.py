"""Chrome trace JSON (readable by Perfetto and chrome://tracing) of simulated time.

One process per traced op, one thread per rank; every send, receive, reduction and staging
copy is a complete ("X") event at its simulated start, in microseconds.
"""
from __future__ import annotations

import json


def chrome_events(sections, thread_names=None) -> list:
    """sections: iterable of (label, events) with events as (rank, name, start_ns, end_ns, args);
    `thread_names`: a label per thread id other than "rank N" (e.g. a rank's streams)."""
    out = []
    offset = 0
    for pid, (label, events) in enumerate(sections):
        out.append({"ph": "M", "pid": pid, "name": "process_name", "args": {"name": label}})
        ranks = sorted({e[0] for e in events})
        for r in ranks:
            name = (thread_names or {}).get(r, f"rank {r}")
            out.append({"ph": "M", "pid": pid, "tid": r, "name": "thread_name", "args": {"name": name}})
        base = min((e[2] for e in events), default=0)
        last = 0
        for rank, name, start, end, args in events:
            out.append({"ph": "X", "pid": pid, "tid": rank, "name": name, "cat": name.split("-")[0].split("<")[0],
                        "ts": (offset + start - base) / 1000.0, "dur": (end - start) / 1000.0, "args": args})
            last = max(last, end - base)
        offset += last + 1000   # leave 1 us between ops
    return out


def write(path: str, sections, thread_names=None) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump({"traceEvents": chrome_events(sections, thread_names), "displayTimeUnit": "ns"}, f)
