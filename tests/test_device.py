"""The simulated NPU and runtime: HBM allocator, streams, events, kernels, copies, lifecycle,
and collectives issued on streams overlapping compute."""
import math
import warnings

import numpy as np
import pytest

import hccl_sim
from hccl_sim import HcclError
from hccl_sim.npu.device import ALIGNMENT, Allocator, Device, Runtime


@pytest.fixture
def dev():
    return Device(0, hccl_sim.topology("atlas800t-a2"))


@pytest.mark.unit
def test_allocator_alignment_reuse_and_merging():
    a = Allocator(64 * ALIGNMENT)
    x, y, z = a.alloc(1), a.alloc(ALIGNMENT + 1), a.alloc(3 * ALIGNMENT)
    assert (x, y, z) == (0, ALIGNMENT, 3 * ALIGNMENT)
    a.release(y)
    assert a.alloc(2 * ALIGNMENT) == ALIGNMENT          # first fit reuses the hole
    a.release(x), a.release(ALIGNMENT), a.release(z)
    assert a.in_use == 0 and a.largest_free == 64 * ALIGNMENT    # neighbours merged back


@pytest.mark.unit
def test_hbm_capacity_and_oom_message(dev):
    assert dev.hbm_bytes == 64 << 30
    big = dev.malloc(60 << 30, tag="weights")
    with pytest.raises(HcclError, match=r"out of HBM: activations needs 8.00 GiB, 4.00 GiB of 64.00 GiB free") as info:
        dev.malloc(8 << 30, tag="activations")
    assert info.value.code == "E_MEMORY" and info.value.rank == 0
    dev.free(big)
    dev.malloc(8 << 30)                                  # fits again


@pytest.mark.unit
def test_use_after_free_and_double_free(dev):
    a = dev.empty((4,), np.float32)
    a.data[:] = 3
    dev.free(a)
    with pytest.raises(HcclError, match="use of freed"):
        a.data
    with pytest.raises(HcclError, match="double free"):
        dev.free(a)


@pytest.mark.unit
def test_streams_are_ordered_and_events_order_streams(dev):
    s1, s2 = dev.stream(), dev.stream()
    _, e1 = s1.compute(flops=320e12 * 1e-3)             # 1 ms of FP16 on the 910B roofline
    assert e1 == 1_000_000 + dev.model.launch_ns
    ev = s1.record_event()
    s2.wait_event(ev)
    start, _ = s2.compute(bytes=585_000)                 # memory-bound: 1 us at 585 GB/s
    assert start == e1
    assert dev.clock == 0                                # issuing is asynchronous
    s2.synchronize()
    assert dev.clock == s2.tail


@pytest.mark.unit
def test_roofline_and_copies(dev):
    m = dev.model
    assert m.kernel_ns(flops=320e12, nbytes=0) == 10**9 + m.launch_ns
    assert m.kernel_ns(flops=1, nbytes=585 * 10**9) == 10**9 + m.launch_ns
    host = np.arange(1 << 18, dtype=np.float32)
    d = dev.empty(host.shape, np.float32)
    start, end = dev.memcpy(d, host, "h2d")
    assert np.array_equal(d.data, host) and end - start == m.pcie_latency_ns + math.ceil(host.nbytes * 1e9 / 27.2e9)
    back = np.empty_like(host)
    dev.memcpy(back, d, "d2h")
    assert np.array_equal(back, host)
    with pytest.raises(HcclError, match="memcpy kind"):
        dev.memcpy(back, d, "p2p")


@pytest.mark.unit
def test_runtime_lifecycle_and_leaks():
    topo = hccl_sim.topology("atlas800t-a2")
    rt = Runtime(3, topo)
    with pytest.raises(HcclError, match="set_device before init"):
        rt.set_device(3)
    rt.init()
    with pytest.raises(HcclError, match="init called twice"):
        rt.init()
    with pytest.raises(HcclError, match="owns NPU 3"):
        rt.set_device(5)
    d = rt.set_device(3)
    kept = d.malloc(1000, tag="kv-cache")
    assert rt.finalize() == [("kv-cache", 1000, kept.ptr)]
    with pytest.raises(HcclError, match="finalised"):
        d.malloc(10)
    with pytest.raises(HcclError, match="finalize without"):
        rt.finalize()


@pytest.mark.local
def test_ccl_buffer_comes_from_hbm_and_can_run_out():
    topo = hccl_sim.topology("atlas800t-a2")
    used = hccl_sim.run(lambda c: c.device.allocator.in_use, topology=topo, env={"HCCL_BUFFSIZE": "300"})
    assert used == [2 * 300 << 20] * 8
    with pytest.raises(HcclError, match="out of HBM: ccl-buffer needs 78.12 GiB") as info:
        hccl_sim.run(lambda c: None, topology=topo, env={"HCCL_BUFFSIZE": "40000"})
    assert info.value.code == "E_MEMORY"


@pytest.mark.local
def test_leaks_are_reported_when_a_run_ends():
    with pytest.warns(ResourceWarning, match="never freed: scratch 4096 B"):
        hccl_sim.run(lambda c: c.device.malloc(4096, tag="scratch"), topology=hccl_sim.topology("fullmesh", ranks=2))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        hccl_sim.run(lambda c: c.device.free(c.device.malloc(4096)), topology=hccl_sim.topology("fullmesh", ranks=2))


@pytest.mark.local
def test_collective_on_a_stream_overlaps_compute():
    """Two independent streams end at the later of the two, not the sum."""
    topo = hccl_sim.topology("fullmesh", ranks=4, bandwidth=1e9, latency=1e-6)
    ar_ns = round(hccl_sim.simulate("allreduce", 4 << 20, topology=topo, algo="ring").time * 1e9)

    def fn(comm, kernel_ns):
        comm_stream, compute_stream = comm.device.stream(), comm.device.stream()
        work = comm.all_reduce(np.ones(1 << 20, np.float32), algo="ring", stream=comm_stream)
        _, kernel_end = compute_stream.enqueue("matmul", kernel_ns)
        assert comm.clock == 0 and not work.is_completed()
        y = work.wait()
        compute_stream.synchronize()
        return comm.clock, kernel_end, work.end, float(y[0])
    for kernel_ns in (ar_ns // 2, 2 * ar_ns):
        for clock, kernel_end, ar_end, y0 in hccl_sim.run(fn, topology=topo, args=(kernel_ns,)):
            assert (ar_end, kernel_end, y0) == (ar_ns, kernel_ns, 4.0)
            assert clock == max(ar_ns, kernel_ns)


@pytest.mark.local
def test_stream_order_and_event_dependency_across_ranks():
    """A collective issued after a kernel on the same stream starts when the kernel ends."""
    topo = hccl_sim.topology("fullmesh", ranks=2, bandwidth=1e9, latency=1e-6)

    def fn(comm):
        s = comm.device.stream()
        s.enqueue("forward", 5000 * (comm.rank + 1))     # rank 1's kernel is longer
        work = comm.all_reduce(np.ones(4, np.float32), stream=s)
        return work.record.start, work.wait() is not None, comm.clock
    (s0, _, c0), (s1, _, c1) = hccl_sim.run(fn, topology=topo)
    assert (s0, s1) == (5000, 10000)
    assert c0 == c1 > 10000                               # both wait for the later rank

    def barrier(comm):                                    # HcclBarrier on a stream: the same
        s = comm.device.stream()
        s.enqueue("forward", 5000 * (comm.rank + 1))
        work = comm.barrier(stream=s)
        return work.record.start, comm.clock, work.wait() is None, comm.clock
    (s0, h0, r0, c0), (s1, h1, r1, c1) = hccl_sim.run(barrier, topology=topo)
    assert (s0, s1, h0, h1) == (5000, 10000, 0, 0) and r0 and r1 and c0 == c1 > 10000


@pytest.mark.local
def test_device_arrays_as_collective_inputs():
    def fn(comm):
        d = comm.device.empty((3,), np.int32)
        d.data[:] = comm.rank + 1
        out = comm.all_reduce(d)
        comm.device.free(d)
        return out
    assert all(np.array_equal(y, [3, 3, 3]) for y in hccl_sim.run(fn, topology=hccl_sim.topology("fullmesh", ranks=2)))
