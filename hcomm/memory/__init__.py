"""Memory every rank of a node can map: where the shared-memory data plane keeps ranks' buffers.

- `segments`: POSIX shared-memory segments (the Ray engine's and a torchrun job's ranks, one process each);
- `windows`: MPI-3 shared-memory windows among the MPI processes of one node;
- `provider`: the one interface the plane (hcomm.exec.shared_plane) uses over either, and its
  two implementations (`SegmentProvider`, `WindowProvider`);
- `pool`: the result pool, whose reuse rule (an array is free once user code holds no reference
  to it) is written once, for every engine.
"""
