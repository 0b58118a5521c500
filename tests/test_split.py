"""Multi-device split: tensor/pipeline plans that respect every device's memory and real rates."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from _recommend_hw import H100, H200, HOST, RTX3070, nvlink_box, one

from autoopt.hardware.profile import HardwareProfile
from autoopt.planning.catalog import get_model
from autoopt.planning.quant import get_format
from autoopt.planning.split import (
    Workload,
    allreduce_us,
    candidate_splits,
    devices_of,
    link_gbs,
    pcie_gbs,
    plan_split,
)

WL = Workload(batch=1, prompt_len=512, gen_len=128)

ROOT = Path(__file__).resolve().parents[1]


def test_llama3_70b_bf16_gets_a_valid_split_of_two_or_four_h100():
    box = nvlink_box(H100, 8, "8x h100")
    m, bf16 = get_model("llama-3-70b"), get_format("bf16")
    assert plan_split(one(H100, "h100"), m, bf16, WL) is None  # 141 GB of weights, 85.5 GB card
    plan = plan_split(box, m, bf16, WL, max_devices=4)
    assert plan.num_devices in (2, 4) and plan.fits
    assert all(s.memory.fits for s in plan.stages)
    assert plan_split(box, m, bf16, WL, objective="devices").num_devices == 2


def test_fastest_split_on_eight_h100_is_tensor_parallel_eight():
    plan = plan_split(nvlink_box(H100, 8, "8x h100"), get_model("llama-3-70b"), get_format("bf16"), WL)
    assert (plan.kind, plan.tp, plan.pp) == ("tensor", 8, 1)
    assert 0 < plan.comm_us < plan.predicted_us


def test_pipeline_ranges_cover_every_layer_once():
    plans = candidate_splits(nvlink_box(H100, 4, "4x h100"), get_model("llama-3-70b"), get_format("bf16"), WL)
    for p in plans:
        covered = [i for s in p.stages for i in range(*s.layers)]
        assert covered == list(range(80))


def test_heterogeneous_pipeline_gives_the_bigger_faster_gpu_more_layers():
    prof = HardwareProfile(name="h200+h100", gpus=(H200.with_(index=0), H100.with_(index=1)),
                           links=())
    plan = next(p for p in candidate_splits(prof, get_model("llama-3-70b"), get_format("bf16"),
                                            Workload(batch=8, prompt_len=512, gen_len=128)) if p.pp == 2)
    (a0, b0), (a1, b1) = (s.layers for s in plan.stages)
    assert plan.stages[0].device_name == "NVIDIA H200" and b0 - a0 > b1 - a1
    assert all(s.memory.fits for s in plan.stages)


def test_gpu_to_gpu_without_nvlink_uses_pcie():
    prof = HardwareProfile(name="2x3070", gpus=(RTX3070.with_(index=0), RTX3070.with_(index=1)))
    a, b = devices_of(prof)
    assert link_gbs(prof, a, b) == (pytest.approx(1.969 * 16), "pcie")  # gen4 x16, 128b/130b


def test_nvlink_bandwidth_comes_from_the_link_table():
    box = nvlink_box(H100, 2, "2x h100")
    a, b = devices_of(box)
    assert link_gbs(box, a, b) == (450.0, "nvlink")


def test_cpu_stage_takes_layers_that_do_not_fit_the_gpu():
    prof = HardwareProfile(name="3070+host", cpu=HOST, gpus=(RTX3070,))
    m = get_model("llama-3-8b")  # 16 GB bf16 > 8 GiB
    assert plan_split(prof, m, get_format("bf16"), WL) is None
    plan = plan_split(prof, m, get_format("bf16"), WL, include_cpu=True)
    assert plan.kind == "pipeline" and [s.device_name for s in plan.stages] == [RTX3070.name, HOST.model]
    assert plan.comm_us > 0  # hidden state over PCIe gen4 x16


def test_pcie_allreduce_follows_the_nccl_ring_model():
    # 3.6 us + 2 x 7 hops x 1.0 us + 1 MB x 2 x 7/8 / 32 GB/s
    assert allreduce_us(1e6, 8, 32.0, "pcie") == pytest.approx(3.6 + 14 * 1.0 + 1e6 * 1.75 / 32e3)


@pytest.mark.parametrize("run", ["h100/nccl_allreduce_tp2", "h100/nccl_allreduce_tp4", "h200/nccl_allreduce_tp2",
                                 "h200/nccl_allreduce_tp2_run2", "h200/nccl_allreduce_tp4"])
def test_nvlink_allreduce_is_within_15_percent_of_every_measured_size(run):
    data = json.loads((ROOT / "benchmarks" / "results" / f"{run}.json").read_text())
    tp, rows = data["world"], data["rows"]
    assert len(rows) == 15 and rows[0]["bytes"] == 16 << 10 and rows[-1]["bytes"] == 256 << 20
    for r in rows:
        assert 1 / 1.15 < allreduce_us(r["bytes"], tp, 450.0, "nvlink") / r["measured_us"] < 1.15, r["bytes"]


def test_nvlink_allreduce_of_a_small_message_pays_the_low_latency_protocols_latency():
    # 16 KiB on 2 GPUs: LL's 8.5 us + 16 KiB / 10 GB/s of bus bandwidth (measured 10.1 us on the H100s,
    # 10.7 and 11.2 on the H200s)
    assert allreduce_us(16 << 10, 2, 450.0, "nvlink") == pytest.approx(8.5 + (16 << 10) / 10e3)


def test_nvlink_allreduce_beyond_the_measured_groups_adds_ring_steps_to_the_largest():
    # 8 GPUs: the 4-GPU table plus 2 x 4 more ring steps of 0.47 us
    table = ((13.0, 10.0), (15.0, 200.0), (22.0, 310.0))
    assert allreduce_us(16 << 10, 8, 450.0, "nvlink") == pytest.approx(
        min(lat + 8 * 0.47 + (16 << 10) * 1.75 / (gbs * 1e3) for lat, gbs in table))


def test_pcie_rate_from_generation_and_width():
    assert pcie_gbs(H100) == pytest.approx(3.938 * 16)


def test_pipeline_balance_counts_the_lm_head_on_the_last_stage():
    # 8 Llama-3-8B layers at decode on two H200s: the 128256-wide LM head costs about as much as a
    # couple of layers, so the last stage takes fewer layers than the first.
    model = dataclasses.replace(get_model("llama-3-8b"), num_layers=8)
    plan = next(p for p in candidate_splits(nvlink_box(H200, 2, "2x h200"), model, get_format("bf16"),
                                            Workload(batch=4, prompt_len=1024, gen_len=16, phase="decode"))
                if p.pp == 2 and p.tp == 1)
    first, last = (s.layers[1] - s.layers[0] for s in plan.stages)
    assert first > last
    assert abs(plan.stages[0].time_us - plan.stages[1].time_us) < max(s.time_us for s in plan.stages) * 0.3


def test_a_steps_tensor_parallel_communication_is_two_all_reduces_a_layer():
    import dataclasses

    from autoopt.hardware.library import load_profile
    from autoopt.planning.split import SplitPlan, Stage, allreduce_us, devices_of, link_gbs, tp_step_comm_us

    hw = load_profile("h100-sxm-8x")
    devs = devices_of(hw)
    plan = SplitPlan(kind="tensor", tp=2, pp=1, stages=(Stage(devices=(0, 1), device_name=devs[0].name, layers=(0, 32),
                     time_us=1.0, memory=None),), predicted_us=1.0, comm_us=0.0, microbatches=1, fits=True, reason="")
    bw, path = link_gbs(hw, devs[0], devs[1])
    assert tp_step_comm_us(hw, plan, 32, 4096, 512) == 2 * 32 * allreduce_us(512 * 4096 * 2, 2, bw, path)
    assert tp_step_comm_us(hw, dataclasses.replace(plan, tp=1), 32, 4096, 512) == 0.0
