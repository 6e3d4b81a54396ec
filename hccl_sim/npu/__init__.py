"""The emulated NPU of every rank: its device (HBM allocator, streams, events, clock) and the
runtime that owns it (`device`)."""
