"""Hardware profiles built by hand for the recommendation tests (datasheet numbers, cited)."""

from __future__ import annotations

from autoopt.hardware.profile import CPUProfile, GPUProfile, HardwareProfile, Link

# NVIDIA H100 SXM5 80GB: 132 SMs, NVML total 85520809984 B (hardware capture h100/probe.txt),
# 3350 GB/s HBM3, 989.4 dense bf16 / 1978.9 dense fp8 TFLOP/s (datasheet, sparse figures halved),
# 18 NVLink4 links = 450 GB/s per direction, PCIe gen5 x16.
H100 = GPUProfile(name="NVIDIA H100 80GB HBM3", cc_major=9, cc_minor=0, sm_count=132,
                  memory_total_bytes=85520809984, mem_bandwidth_gbs=3350.0,
                  peak_tflops={"bf16": 989.4, "fp16": 989.4, "fp8": 1978.9, "fp32": 67.0},
                  pcie_gen=5, pcie_width=16, nvlink_links=18, nvlink_bandwidth_gbs=450.0)
# NVIDIA H200 141GB: 143771 MiB = 150754820096 B, 4800 GB/s HBM3e, same GH100 compute as H100 SXM.
H200 = H100.with_(name="NVIDIA H200", memory_total_bytes=150754820096, mem_bandwidth_gbs=4800.0)
# GeForce RTX 3070 8 GB (GA104, sm_86): 46 SMs, 448 GB/s GDDR6, 40.6 dense fp16/bf16 tensor TFLOP/s with
# fp32 accumulate (NVIDIA Ampere GA102 whitepaper, appendix table for RTX 3070), PCIe gen4 x16.
RTX3070 = GPUProfile(name="NVIDIA GeForce RTX 3070", cc_major=8, cc_minor=6, sm_count=46,
                     memory_total_bytes=8 * 1024**3, mem_bandwidth_gbs=448.0,
                     peak_tflops={"bf16": 40.6, "fp16": 40.6, "fp32": 20.3}, pcie_gen=4, pcie_width=16)


def one(gpu: GPUProfile, name: str) -> HardwareProfile:
    return HardwareProfile(name=name, origin="library", gpus=(gpu,))


def nvlink_box(gpu: GPUProfile, count: int, name: str) -> HardwareProfile:
    gpus = tuple(gpu.with_(index=i) for i in range(count))
    links = tuple(Link(a=a, b=b, kind="nvlink", links=18, bandwidth_gbs=450.0)
                  for a in range(count) for b in range(a + 1, count))
    return HardwareProfile(name=name, origin="library", gpus=gpus, links=links)


# A 2-socket-class host: 64 cores, 512 GiB, 8-channel DDR5-4800 = 8 x 38.4 = 307.2 GB/s;
# peak fp32 = 64 cores x 2 AVX-512 FMA units x 16 lanes x 2 FLOP x 2.0 GHz = 8192 GFLOP/s.
HOST = CPUProfile(model="64-core x86 host", logical_cores=128, physical_cores=64, ram_total_bytes=512 * 1024**3,
                  mem_bandwidth_gbs=307.2, peak_gflops_fp32=8192.0)
