"""The emulated NPU of every rank: its device (HBM allocator, streams, events, clock) and the
runtime that owns it (`device`); a timeline of simulated events written as a Chrome trace
(`chrome_trace`, which bench and training write)."""
