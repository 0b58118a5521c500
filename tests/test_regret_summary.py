"""benchmarks/regret_summary.py: committed regret tables pooled three ways, and what it refuses to read."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import regret_summary

H200 = Path(__file__).resolve().parents[1] / "benchmarks" / "results" / "h200"


def _table(rows: list[tuple[str, float, float]], recommended: str, regret: float = 0.0) -> dict:
    return {"workloads": [{"batch": 1, "recommended": recommended, "regret": regret,
                           "options": [{"label": label, "predicted_ms": p, "measured_ms": m} for label, p, m in rows]}]}


def test_each_row_lands_in_the_sets_it_belongs_to():
    s = regret_summary.summarize(_table([("int4 graphs b1", 1.0, 1.1), ("int4 eager b1", 8.0, 16.0)],
                                        recommended="int4 graphs b1", regret=0.02))
    assert s.regrets == [0.02]
    assert s.recommended.ratios == s.graphed.ratios == [pytest.approx(1 / 1.1)]
    assert s.all.ratios == [pytest.approx(1 / 1.1), 0.5]


def test_within_15_percent_is_the_ratio_not_the_log():
    # 0.86 is within 15 % of 1 though |ln 0.86| = 0.151 > ln 1.15
    rows = regret_summary.Rows([0.86, 1.0, 1.16])
    assert rows.line().startswith("2/3 within 15 %")


def test_an_unmeasured_row_is_left_out():
    s = regret_summary.summarize(_table([("fp8 graphs b32 tensor-parallel x2", None, None)], recommended="x"))
    assert s.all.ratios == []


def test_the_committed_h200_tables_pool_to_one_loss_since_fixed_and_340_of_343_graphed_rows_within_15_percent(
        capsys):
    tables = sorted(str(p) for p in H200.glob("regret_*_rescored.json"))
    assert len(tables) == 32 and regret_summary.main(tables) == 0
    pooled = capsys.readouterr().out.split("pooled over 32 tables: ")[1].splitlines()
    # the one loss: Qwen2.5-7B at batch 32 in run2, where optimize() ran fp8 on cuBLASLt (since priced on its
    # measured timings; run3 and run4 re-measured it: regret 0). The three graphed rows beyond 15 %: Qwen's int8 at
    # batch 16, predicted 1.16-1.17x its time in runs 2-4 (the lowest inside: the first 2-GPU table's
    # tensor-parallel b32 row, 0.864, measured before optimize()'s decode attention and not re-scored since).
    # The four-H200 Llama tables: regret 0.2 % at batch 1 (the one-GPU pick against four replicas' noise), 0 at 8
    # and 32 (bf16 tensor-parallel over four priced 0.89x its time at 32, with the uncompiled norms' growth by
    # rows; 0.84x without). The recalibration's two tables (run9, Qwen run6): regret 0, recommended 7/7, graphed
    # 28/28. 2026-11-29's two-H200 tables (Llama b1 / b8, Qwen b16 / b32): regret 0.4 % (batch 1, the one-GPU
    # pick against two replicas' noise), 1.6 % (batch 8: int4 at a replica's 4 rows priced 0.96x its time) and 0;
    # the four-H200 Qwen tables after them (b1, b16): regret 0; every graphed row of those four inside (0.892-1.082).
    # Llama run11 and Qwen run8 (after the fp8 / int8 dot path's load term): regret 0 on seven workloads, graphed
    # 28/28. The swapped decode GEMV's tables (quant_gemv_swap; Llama b8 twice, Qwen b8, b16): regret 0, graphed
    # 16/16. Batch 32 after its 32-token tile: in the run int4 was picked (its first 32-token price had it 0.82x)
    # where int8 measured fastest, 0.02 % (Llama) and 5.5 % (Qwen) regret; re-scored on the price recalibrated on
    # the kernel grids (not on these tables) int8 is picked, 0 and 0; re-measured at that price on a four-H200 host
    # (`_b32_swap_run2`): int8 picked on both, regret 0.7 % on Llama (int4 1.617 ms against int8's 1.628) and 0 on
    # Qwen. The four-H200 tables after the swapped GEMV (Llama b8 / b32, Qwen b32; TP rows at the NCCL fit on both
    # hosts): four int4 replicas picked and measured fastest, regret 0 x3, graphed 27/27
    assert pooled[0] == "regret max 7.1%, median 0.0% over 67 workloads"
    assert pooled[1].startswith("  recommended: 67/67 within 15 %")
    assert pooled[2].startswith("  graphed:     340/343 within 15 %")


def test_the_qwen_table_measured_after_the_fp8_dispatch_fix_has_no_regret(capsys):
    assert regret_summary.main([str(H200 / "regret_qwen_1gpu_layers8_run3_rescored.json")]) == 0
    assert "regret max 0.0%, median 0.0% over 4 workloads" in capsys.readouterr().out


@pytest.mark.parametrize(("text", "says"), [
    ("not json", "not JSON"),
    (json.dumps({"workloads": [{"batch": 1}]}), "not a regret table"),
    (json.dumps([1, 2]), "not a regret table"),
])
def test_a_file_that_is_not_a_table_is_one_line_and_exit_2(tmp_path, capsys, text, says):
    path = tmp_path / "t.json"
    path.write_text(text)
    assert regret_summary.main([str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("regret_summary: ") and says in err and err.count("\n") == 1
