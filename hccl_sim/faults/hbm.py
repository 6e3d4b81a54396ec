"""HBM another tenant of an NPU holds (the fault plan's hbm_pressure entries), as one rank's device
sees it over its simulated time: what an allocation may use beside it, and whether a link setup
finds the device memory it needs (docs/design.md, "Faults contract"; docs/references.md §10.2).

A rank's Device holds its HbmPressure (`device.pressure`), which the engine's bootstrap sets once
the world communicator has its CCL buffer: the tenant comes after the job's init. `at` entries
are held from their time; `at_op` ones from the rank's entry into that op of its world
communicator, which the communicator reports (`enter_op`). Only the pressured rank's device knows
its free HBM, so its communicator says in each rendezvous call which entry, if any, starves a
link setup there (hccl_sim.faults.progress carries it), and every rank plans the same outcome.
"""
from __future__ import annotations

LINK_SETUP_BYTES = 256 << 10
"""The least device memory a link setup allocates: a QP takes 0.25 to 3 MB by its depth (HCCL's
EI0011 "Failed to allocate [size: [0.25MB, 3MB], Affected by QP depth configuration.] bytes of NPU
memory", hccl:docs/zh/user_guide/fault_diagnosis/param_link_stage.md; docs/references.md §10.2).
A pressure that leaves less than this free fails the setup."""


class HbmPressure:
    """One rank's hbm_pressure entries over its simulated time. Each entry is (its index among the
    plan's pressures, at_op or None, at ns or None, duration ns or None, bytes or None, label)."""

    def __init__(self, entries):
        self.entries = tuple(entries)
        self._starts = {e[0]: e[2] for e in self.entries if e[1] is None}    # index -> held from, ns

    def __repr__(self):
        return f"<HbmPressure {[e[5] for e in self.entries]} held from {self._starts}>"

    def enter_op(self, op_index: int, entry_ns: int) -> None:
        """The rank enters op `op_index` of its world communicator at `entry_ns`: an entry whose
        at_op it is holds from then on (the first time only: op indices do not repeat)."""
        for index, at_op, *_ in self.entries:
            if at_op == op_index and index not in self._starts:
                self._starts[index] = entry_ns

    def _held(self, clock: int):
        """(index, bytes or None, label) of every entry held at `clock`, in plan order."""
        out = []
        for index, _, _, duration, nbytes, label in self.entries:
            start = self._starts.get(index)
            if start is not None and start <= clock and (duration is None or clock < start + duration):
                out.append((index, nbytes, label))
        return out

    def holding(self, clock: int, free: int) -> tuple:
        """(bytes held of the `free` ones at `clock`, the label of the first entry held), (0, None)
        when none is. Bytes None: all that is free; several entries add up."""
        held, label = 0, None
        for _, nbytes, name in self._held(clock):
            held = free if nbytes is None else held + nbytes
            label = label or name
        return min(held, free), label

    def starving(self, clock: int, free: int) -> int:
        """1 + the index (among the plan's pressures) of the entry that leaves a link setup at
        `clock` less than LINK_SETUP_BYTES of the `free` bytes; 0 when none does."""
        held = 0
        for index, nbytes, _ in self._held(clock):
            held = free if nbytes is None else held + nbytes
            if free - held < LINK_SETUP_BYTES:
                return index + 1
        return 0


def pressure_for(faults, rank: int):
    """The HbmPressure of world rank `rank` under a bound plan (BoundFaults), or None: no entry
    presses on it."""
    if faults is None or not faults.pressures:
        return None
    mine = [(i, at_op, at, duration, nbytes, label)
            for i, (r, at_op, at, duration, nbytes, label) in enumerate(faults.pressures) if r == rank]
    return HbmPressure(mine) if mine else None


def starving_first_op(faults, rank: int, entry_ns: int, free: int) -> int:
    """HbmPressure.starving for the job's first op (number 0), entered at `entry_ns` with `free`
    bytes of HBM: what hccl_sim.simulate, which runs that op alone, plans with."""
    pressure = pressure_for(faults, rank)
    if pressure is None:
        return 0
    pressure.enter_op(0, entry_ns)
    return pressure.starving(entry_ns, free)
