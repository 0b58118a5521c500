"""The fused-MoE config files vLLM and SGLang read at start-up: names, folders, JSON, shard arithmetic,
writing, the ``autoopt export moe-configs`` command and the runtime export that points at the folder.

Fixtures are written by hand from the format description (vLLM 0.33 fused_moe.py get_config_file_name,
SGLang fused_moe_triton_config.py), never copied from either runtime.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from autoopt.cli import main
from autoopt.errors import ExportError, OpError, RuntimeRuleError
from autoopt.planning.catalog import get_model
from autoopt.planning.moe_configs import choose_all, fused_moe_op, model_shards
from autoopt.runtimes.moe_configs import (
    CONFIG_KEYS,
    M_VALUES,
    ConfigFileName,
    MoeEntry,
    MoeShard,
    config_folder,
    device_file_name,
    file_name,
    moe_shards,
    nearest_m,
    parse_file_name,
    render_json,
    sidecar_name,
    write_configs,
)
from tests._fuzz import budget

H100 = "NVIDIA H100 80GB HBM3"  # torch.cuda.get_device_name() on the H100 (hardware-captures/h100/probe.txt)
H200 = "NVIDIA H200"            # on the H200 (hardware-captures/h200x2/probe2.txt)
CFG = {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 128, "GROUP_SIZE_M": 1, "num_warps": 4,
       "num_stages": 3}


def fixed(shard: MoeShard, m: int) -> MoeEntry:
    """A chooser standing in for rank(): a config that depends on M, labelled predicted."""
    return MoeEntry(params={**CFG, "BLOCK_SIZE_M": 16 if m <= 32 else 64}, predicted_us=float(m), source="fixture")


def shard(**kw: object) -> MoeShard:
    base: dict[str, object] = {"experts": 8, "intermediate": 14336, "hidden": 4096, "topk": 2}
    return MoeShard(**{**base, **kw})  # type: ignore[arg-type]


# -- file names ---------------------------------------------------------------------------------------
def test_vllm_names_an_fp8_mixtral_file_on_the_h100():
    assert file_name("vllm", shard(dtype="fp8_w8a8"), H100) == \
        "E=8,N=14336,device_name=NVIDIA_H100_80GB_HBM3,dtype=fp8_w8a8.json"


def test_vllm_names_a_16_bit_file_without_a_dtype_selector():
    assert file_name("vllm", shard(), H100) == "E=8,N=14336,device_name=NVIDIA_H100_80GB_HBM3.json"
    assert file_name("vllm", shard(dtype="fp16"), H100) == "E=8,N=14336,device_name=NVIDIA_H100_80GB_HBM3.json"


def test_vllm_writes_a_block_shape_without_a_space():
    s = shard(experts=256, intermediate=128, hidden=7168, topk=8, dtype="fp8_w8a8", block_shape=(128, 128))
    assert file_name("vllm", s, H100) == \
        "E=256,N=128,device_name=NVIDIA_H100_80GB_HBM3,dtype=fp8_w8a8,block_shape=[128,128].json"


def test_sglang_writes_a_block_shape_as_a_python_list():
    s = shard(experts=256, intermediate=128, hidden=7168, topk=8, dtype="fp8_w8a8", block_shape=(128, 128))
    assert file_name("sglang", s, H100) == \
        "E=256,N=128,device_name=NVIDIA_H100_80GB_HBM3,dtype=fp8_w8a8,block_shape=[128, 128].json"


def test_a_group_size_with_a_zero_side_names_no_block_shape():
    assert file_name("vllm", shard(dtype="int4_w4a16", block_shape=(0, 128)), H100) == \
        "E=8,N=14336,device_name=NVIDIA_H100_80GB_HBM3,dtype=int4_w4a16.json"


def test_vllm_names_every_h200_variant_nvidia_h200():
    assert device_file_name(H200, "vllm") == "NVIDIA_H200"
    assert device_file_name("NVIDIA H200 NVL", "vllm") == "NVIDIA_H200"
    assert device_file_name("NVIDIA H200 NVL", "sglang") == "NVIDIA_H200_NVL"


def test_vllm_folds_runs_of_whitespace_and_slashes_into_one_underscore():
    assert device_file_name("NVIDIA  A100/PCIe", "vllm") == "NVIDIA_A100_PCIe"
    assert device_file_name("NVIDIA A100-SXM4-80GB", "vllm") == "NVIDIA_A100-SXM4-80GB"


def test_sglang_names_per_channel_files_and_vllm_has_none():
    s = shard(dtype="fp8_w8a8", per_channel=True)
    assert file_name("sglang", s, H100).endswith(",dtype=fp8_w8a8,per_channel_quant=True.json")
    with pytest.raises(RuntimeRuleError, match="per-channel"):
        file_name("vllm", s, H100)


def test_vllm_has_no_int8_w8a8_file_and_sglang_has_no_fp8_w8a16_file():
    with pytest.raises(RuntimeRuleError, match="int8_w8a8"):
        file_name("vllm", shard(dtype="int8_w8a8"), H100)
    with pytest.raises(RuntimeRuleError, match="fp8_w8a16"):
        file_name("sglang", shard(dtype="fp8_w8a16"), H100)


def test_parse_reads_both_runtimes_block_shapes():
    for name in ("E=256,N=128,device_name=NVIDIA_H200,dtype=fp8_w8a8,block_shape=[128,128].json",
                 "E=256,N=128,device_name=NVIDIA_H200,dtype=fp8_w8a8,block_shape=[128, 128].json"):
        assert parse_file_name(name) == ConfigFileName(experts=256, intermediate=128, device="NVIDIA_H200",
                                                       dtype="fp8_w8a8", block_shape=(128, 128))


def test_parse_refuses_sidecars_and_other_files():
    for name in ("E=8,N=14336,device_name=NVIDIA_H200.autoopt.json", "README", "E=8,N=0,device_name=X.json",
                 "E=8,N=7168,device_name=NVIDIA_H200,dtype=fp8_w8a8_down.json"):
        with pytest.raises(RuntimeRuleError, match=r"not a fused-MoE config file name|unknown dtype"):
            parse_file_name(name)


_devices = st.from_regex(r"[A-Za-z0-9()\-]{1,12}(_[A-Za-z0-9()\-]{1,12}){0,4}", fullmatch=True).filter(
    lambda d: "H200" not in d.split("_"))


@budget(200)
@given(e=st.integers(1, 1024), n=st.integers(1, 1 << 16), device=_devices,
       dtype=st.sampled_from([None, "fp8_w8a8", "int8_w8a16", "int4_w4a16"]),
       block=st.sampled_from([None, (128, 128), (64, 128)]), runtime=st.sampled_from(["vllm", "sglang"]))
def test_a_written_name_parses_back_to_its_parts(e, n, device, dtype, block, runtime):
    name = ConfigFileName(experts=e, intermediate=n, device=device, dtype=dtype,
                          block_shape=block if dtype == "fp8_w8a8" else None)
    assert parse_file_name(name.render(runtime)) == name


# -- shards ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("tp", "n"), [(1, 14336), (2, 7168), (8, 1792)])
def test_mixtral_under_tensor_parallelism_splits_n(tp, n):
    (s,) = model_shards(get_model("mixtral-8x7b"), "vllm", tp=tp)
    assert (s.experts, s.intermediate, s.hidden, s.topk) == (8, n, 4096, 2)


def test_qwen3_30b_a3b_at_tp1_has_128_experts_of_768():
    (s,) = model_shards(get_model("qwen3-30b-a3b"), "vllm")
    assert (s.experts, s.intermediate, s.topk) == (128, 768, 8)


def test_vllm_expert_parallelism_splits_experts_and_keeps_n_whole():
    (s,) = model_shards(get_model("qwen3-30b-a3b"), "vllm", tp=8, ep=8)
    assert (s.experts, s.intermediate, s.tp, s.ep) == (16, 768, 1, 8)


def test_sglang_splits_n_over_tp_divided_by_ep():
    (s,) = moe_shards("sglang", experts=128, intermediate=768, hidden=2048, topk=8, tp=8, ep=2)
    assert (s.experts, s.intermediate, s.tp) == (64, 192, 4)


def test_uneven_expert_parallelism_gives_both_rank_sizes():
    shards = moe_shards("vllm", experts=60, intermediate=1408, hidden=2048, topk=4, tp=8, ep=8)
    assert [s.experts for s in shards] == [8, 7]


def test_shard_rules_refuse_what_the_runtimes_assert():
    with pytest.raises(RuntimeRuleError, match="multiple of tp"):
        moe_shards("vllm", experts=8, intermediate=14336, hidden=4096, topk=2, tp=4, ep=2)
    with pytest.raises(RuntimeRuleError, match="must divide tp"):
        moe_shards("sglang", experts=8, intermediate=14336, hidden=4096, topk=2, tp=2, ep=4)
    with pytest.raises(RuntimeRuleError, match="does not split"):
        moe_shards("vllm", experts=8, intermediate=14336, hidden=4096, topk=2, tp=3)


def test_a_dense_model_has_no_shard():
    with pytest.raises(Exception, match="no routed experts"):
        model_shards(get_model("llama-3-8b"), "vllm")


# -- JSON -----------------------------------------------------------------------------------------------
def test_vllm_json_has_triton_version_first_then_every_m_ascending_with_keys_in_order():
    text = render_json("vllm", choose_all(fixed, shard()), triton_version="3.6.0")
    data = json.loads(text)
    assert list(data) == ["triton_version", *map(str, M_VALUES)]
    assert data["triton_version"] == "3.6.0"
    assert list(data["1"]) == list(CONFIG_KEYS)
    assert data["1"]["BLOCK_SIZE_M"] == 16 and data["4096"]["BLOCK_SIZE_M"] == 64


def test_sglang_json_holds_only_m_keys():
    data = json.loads(render_json("sglang", choose_all(fixed, shard()), triton_version="3.6.0"))
    assert all(k.isdigit() for k in data)


def test_an_entry_with_a_missing_or_extra_key_is_refused():
    with pytest.raises(RuntimeRuleError, match="missing \\['num_stages'\\]"):
        MoeEntry(params={k: v for k, v in CFG.items() if k != "num_stages"})
    with pytest.raises(RuntimeRuleError, match="unknown \\['SPLIT_K'\\]"):
        MoeEntry(params={**CFG, "SPLIT_K": 1})


def test_nearest_m_takes_the_smaller_key_on_a_tie():
    assert nearest_m(20) == 16 and nearest_m(28) == 24 and nearest_m(9000) == 4096 and nearest_m(1) == 1


# -- writing -------------------------------------------------------------------------------------------
def test_vllm_files_go_in_the_folder_itself_and_sglang_in_its_triton_folder(tmp_path):
    assert config_folder("vllm", tmp_path) == tmp_path
    assert config_folder("sglang", tmp_path, "3.4.0") == tmp_path / "configs" / "triton_3_4_0"
    with pytest.raises(RuntimeRuleError, match="Triton version"):
        config_folder("sglang", tmp_path, None)


def test_write_puts_the_json_and_a_sidecar_with_each_entry_labelled(tmp_path):
    w = write_configs("vllm", shard(), H100, choose_all(fixed, shard()), tmp_path)
    assert w.path == tmp_path / "E=8,N=14336,device_name=NVIDIA_H100_80GB_HBM3.json"
    assert w.sidecar == tmp_path / sidecar_name(w.path.name)
    side = json.loads(w.sidecar.read_text())
    assert side["generator"] == "autoopt" and side["entries"]["1"]["label"] == "predicted"
    assert (w.measured, w.predicted) == (0, len(M_VALUES))


def test_write_leaves_no_temporary_file_behind(tmp_path):
    write_configs("sglang", shard(), H100, choose_all(fixed, shard()), tmp_path, triton_version="3.6.0")
    folder = tmp_path / "configs" / "triton_3_6_0"
    assert sorted(p.name for p in folder.iterdir()) == [
        "E=8,N=14336,device_name=NVIDIA_H100_80GB_HBM3.autoopt.json",
        "E=8,N=14336,device_name=NVIDIA_H100_80GB_HBM3.json"]


def test_a_failed_write_keeps_the_old_file_whole(tmp_path, monkeypatch):
    entries = choose_all(fixed, shard())
    w = write_configs("vllm", shard(), H100, entries, tmp_path)
    before = w.path.read_text()

    def boom(src: str, dst: str) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(ExportError, match="No space left"):
        write_configs("vllm", shard(), H100, {1: MoeEntry(params=CFG)}, tmp_path)
    assert w.path.read_text() == before
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def test_a_file_autoopt_did_not_write_is_kept_unless_forced(tmp_path):
    theirs = tmp_path / "E=8,N=14336,device_name=NVIDIA_H100_80GB_HBM3.json"
    theirs.write_text('{"1": {}}')
    with pytest.raises(ExportError, match="autoopt did not write it"):
        write_configs("vllm", shard(), H100, choose_all(fixed, shard()), tmp_path)
    assert theirs.read_text() == '{"1": {}}'
    w = write_configs("vllm", shard(), H100, choose_all(fixed, shard()), tmp_path, force=True)
    assert w.replaced and json.loads(theirs.read_text())["1"] == {**CFG}


def test_autoopts_own_file_is_replaced_without_force(tmp_path):
    write_configs("vllm", shard(), H100, choose_all(fixed, shard()), tmp_path)
    assert write_configs("vllm", shard(), H100, choose_all(fixed, shard()), tmp_path).replaced


def test_a_sidecar_that_is_not_a_regular_file_is_not_taken_for_autoopts(tmp_path):
    theirs = tmp_path / "E=8,N=14336,device_name=NVIDIA_H100_80GB_HBM3.json"
    theirs.write_text('{"1": {}}')
    os.mkfifo(tmp_path / sidecar_name(theirs.name))  # reading it would block forever
    with pytest.raises(ExportError, match="autoopt did not write it"):
        write_configs("vllm", shard(), H100, choose_all(fixed, shard()), tmp_path)
    assert theirs.read_text() == '{"1": {}}'


def test_an_out_path_that_is_a_file_is_refused(tmp_path):
    f = tmp_path / "file"
    f.write_text("x")
    with pytest.raises(ExportError, match="is a file, not a folder"):
        write_configs("vllm", shard(), H100, choose_all(fixed, shard()), f / "sub")


# -- the default chooser --------------------------------------------------------------------------------
def test_the_default_chooser_needs_the_fused_moe_op_kind(monkeypatch):
    import autoopt.planning.moe_configs as mc

    monkeypatch.setattr(mc, "OP_KINDS", {k: v for k, v in mc.OP_KINDS.items() if k != "fused_moe"})
    with pytest.raises(OpError, match="no 'fused_moe' op kind"):
        fused_moe_op(shard(), 16)


# -- the command ----------------------------------------------------------------------------------------
def _fake_rank(monkeypatch: pytest.MonkeyPatch) -> None:
    import autoopt.planning.moe_configs as mc

    monkeypatch.setattr(mc, "rank_chooser", lambda gpu: fixed)


def test_export_writes_the_file_prints_its_path_and_summarises_on_stderr(tmp_path, monkeypatch, capsys):
    _fake_rank(monkeypatch)
    rc = main(["export", "moe-configs", "--model", "mixtral-8x7b", "--tp", "2", "--profile", "h100-sxm",
               "--out", str(tmp_path)])
    out, err = capsys.readouterr()
    assert rc == 0
    assert out.strip() == str(tmp_path / "E=8,N=7168,device_name=NVIDIA_H100_80GB_HBM3.json")
    assert "18 predicted entries" in err and f"VLLM_TUNED_CONFIG_FOLDER={tmp_path}" in err


def test_export_with_explicit_sizes_names_the_h200_file(tmp_path, monkeypatch, capsys):
    _fake_rank(monkeypatch)
    rc = main(["export", "moe-configs", "--experts", "128", "--intermediate", "768", "--topk", "8", "--hidden", "2048",
               "--dtype", "fp8_w8a8", "--profile", "h200", "--out", str(tmp_path)])
    assert rc == 0
    assert capsys.readouterr().out.strip().endswith("E=128,N=768,device_name=NVIDIA_H200,dtype=fp8_w8a8.json")


@pytest.mark.parametrize(("argv", "message"), [
    (["--model", "mixtral-8x7b", "--experts", "8"], "give --model or"),
    (["--experts", "8"], "missing --intermediate --topk --hidden"),
    (["--model", "mixtral-8x7b", "--gpus", "all"], "add --tune"),
    (["--model", "mixtral-8x7b", "--tp", "3"], "does not split"),
    (["--model", "llama-3-8b"], "no routed experts"),
    (["--model", "mixtral-8x7b", "--block-shape", "128"], "two integers"),
    (["--model", "mixtral-8x7b", "--runtime", "llama.cpp"], "invalid choice"),
])
def test_export_errors_are_one_line_and_exit_2(tmp_path, monkeypatch, capsys, argv, message):
    _fake_rank(monkeypatch)
    rc = main(["export", "moe-configs", "--profile", "h100-sxm", "--out", str(tmp_path), *argv])
    err = capsys.readouterr().err
    assert rc == 2 and message in err and len(err.strip().splitlines()) == 1


def test_export_refuses_a_stranger_file_with_exit_2(tmp_path, monkeypatch, capsys):
    _fake_rank(monkeypatch)
    (tmp_path / "E=8,N=14336,device_name=NVIDIA_H100_80GB_HBM3.json").write_text("{}")
    rc = main(["export", "moe-configs", "--model", "mixtral-8x7b", "--profile", "h100-sxm", "--out", str(tmp_path)])
    assert rc == 2 and "--force" in capsys.readouterr().err


def test_tune_labels_measured_entries_and_falls_back_where_nothing_matched(monkeypatch):
    import autoopt.tuning.moe_configs as tmc
    from autoopt.kernels.config import KernelConfig
    from autoopt.kernels.ops import OpSpec
    from autoopt.tuning.campaign import TunedOp
    from autoopt.tuning.moe_configs import tuned_entries
    from autoopt.tuning.tuner import Trial, TuneResult

    # the op kind lands separately: a GEMM op of the same M stands in for the fused_moe op here
    monkeypatch.setattr(tmc, "fused_moe_op", lambda s, m: OpSpec(kind="gemm", shape=(m, s.intermediate, s.hidden)))

    s = shard()
    seen: list[str] = []

    def measure(ops):  # a fake tuner: M=1 finds nothing that matches the reference, the rest a winner
        seen.extend(name for name, _ in ops)
        out = []
        for name, op in ops:
            ok = op.shape[0] != 1
            trial = Trial(config=KernelConfig(kernel="fused_moe", params={**CFG, "num_warps": 8}), source="seed",
                          predicted_us=5.0, label="measured" if ok else "rejected", us=4.0 if ok else None)
            out.append(TunedOp(name=name, result=TuneResult(op=op, gpu=H100, trials=(trial,), stopped="trials",
                                                            elapsed_s=0.1)))
        return out

    entries = tuned_entries(s, measure, fixed)
    assert seen == [f"fused_moe M={m}" for m in M_VALUES]
    assert entries[1].label == "predicted" and "no tuned config matched" in entries[1].source
    assert entries[16].label == "measured" and entries[16].measured_us == 4.0 and entries[16].params["num_warps"] == 8


# -- the runtime export ---------------------------------------------------------------------------------
def test_recommend_args_points_vllm_at_the_config_folder(tmp_path, capsys):
    rc = main(["recommend", "--model", "mixtral-8x7b", "--profile", "h100-sxm", "--runtime", "vllm",
               "--format", "args", "--moe-configs", str(tmp_path)])
    line = capsys.readouterr().out.strip()
    assert rc == 0 and line.startswith(f"VLLM_TUNED_CONFIG_FOLDER={tmp_path} vllm serve mistralai/Mixtral-8x7B-v0.1")


def test_recommend_args_points_sglang_at_its_config_dir(tmp_path, capsys):
    rc = main(["recommend", "--model", "qwen3-30b-a3b", "--profile", "h100-sxm", "--runtime", "sglang",
               "--format", "args", "--moe-configs", str(tmp_path)])
    assert rc == 0 and capsys.readouterr().out.startswith(f"SGLANG_MOE_CONFIG_DIR={tmp_path} python -m sglang")


def test_a_dense_model_gets_no_config_folder(tmp_path, capsys):
    main(["recommend", "--model", "llama-3-8b", "--profile", "h100-sxm", "--runtime", "vllm", "--format", "args",
          "--moe-configs", str(tmp_path)])
    assert capsys.readouterr().out.startswith("vllm serve")


def test_the_plan_under_vllm_lists_its_fused_moe_kernel_with_the_files_config():
    from autoopt.planning.recommendation import recommend

    rec = recommend("h100-sxm", "mixtral-8x7b", runtime="vllm", batch=8, moe_chooser=fixed)
    experts = [o for o in rec.ops if o.name == "experts"]
    assert experts and all(o.kernel == "fused_moe_kernel" for o in experts)
    decode = next(o for o in experts if o.phase == "decode")
    assert decode.config == {**CFG, "BLOCK_SIZE_M": 16} and "at M=8" in decode.reason
    assert "the fused-MoE template's estimate" in decode.reason


def test_under_vllm_a_moe_layer_is_priced_as_one_fused_launch_per_gemm_not_per_expert():
    # Qwen3-235B-A22B on 8 H100s at batch 1: 8 experts a token, each priced alone cost ~180 us a layer; the
    # kernel measured 64 us for both GEMMs (moe_runtime_configs.json, TP8 M=1). One EP rank's experts now
    from autoopt.planning.recommendation import recommend

    vllm = recommend("h100-sxm-8x", "qwen3-235b-a22b", runtime="vllm", weight_dtype="bf16", phase="decode")
    (row,) = [o for o in vllm.ops if o.name == "experts"]
    assert row.kind == "fused_moe" and row.shape == (1, 16, 1, 1536, 4096)
    assert 20 < row.predicted_us < 100
    assert not [o for o in vllm.ops if o.name.startswith("expert_")]


def test_a_format_the_fused_kernel_does_not_take_keeps_the_per_expert_estimate():
    from autoopt.planning.recommendation import recommend

    rec = recommend("h100-sxm-8x", "qwen3-235b-a22b", runtime="vllm", weight_dtype="awq", phase="decode")
    assert {o.name for o in rec.ops} >= {"expert_gate_up", "expert_down"}


def test_the_plan_without_a_runtime_keeps_autoopts_expert_gemms():
    from autoopt.planning.recommendation import recommend

    rec = recommend("h100-sxm", "mixtral-8x7b", batch=8, moe_chooser=fixed)
    assert all(o.kernel != "fused_moe_kernel" for o in rec.ops)


def test_written_name_matches_the_name_the_export_note_gives(tmp_path):
    from autoopt.hardware.library import load_profile
    from autoopt.planning.recommendation import recommend
    from autoopt.runtimes.export import export

    prof = load_profile("h100-sxm")
    rec = recommend(prof, "mixtral-8x7b", runtime="vllm")
    out = export(rec.to_dict(), "vllm", profile=prof.to_dict(), moe_configs=str(tmp_path))
    (s,) = model_shards(get_model("mixtral-8x7b"), "vllm", dtype="fp8_w8a8")
    assert any(str(Path(tmp_path) / file_name("vllm", s, H100)) in n for n in out["notes"])


def test_an_int4_w4a16_file_is_written_zero_shot_with_every_k_tile_inside_a_group(tmp_path, capsys):
    # the real ranking (no fake): the fused-MoE template now prices symmetric int4 experts
    rc = main(["export", "moe-configs", "--model", "mixtral-8x7b", "--tp", "8", "--dtype", "int4_w4a16",
               "--profile", "h100-sxm", "--out", str(tmp_path)])
    path = Path(capsys.readouterr().out.strip())
    assert rc == 0 and path.name == "E=8,N=1792,device_name=NVIDIA_H100_80GB_HBM3,dtype=int4_w4a16.json"
    entries = {m: c for m, c in json.loads(path.read_text()).items() if m != "triton_version"}
    assert len(entries) == 18 and all(32 <= c["BLOCK_SIZE_K"] <= 128 for c in entries.values())
