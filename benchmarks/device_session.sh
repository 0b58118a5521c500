#!/usr/bin/env bash
# Run measurement stages on a lent GPU host, from the repository root, results under $OUT.
#   bash benchmarks/device_session.sh capture profile gputests ranking bench norm models
#   GPUS=4 bash benchmarks/device_session.sh tptrace regret   (issue 29 on a 4-GPU host; moeint4: issue 28)
# Each stage's output goes to $OUT/r/<stage>.log (its tail is printed); everything is
# packed into $OUT/results.tgz (the device tool returns at most 8 files; a second run in the same call packs into
# results_2.tgz beside it).
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
R=${OUT:?}/r
mkdir -p "$R"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv > "$R/nvidia-smi.csv" 2>&1
stage() {
  local name=$1; shift
  local t0=$SECONDS
  echo "== $name"
  "$@" > "$R/$name.log" 2>&1
  echo "== $name rc=$? in $((SECONDS - t0)) s"
  tail -n "${TAIL:-20}" "$R/$name.log"
}
for s in "$@"; do
  case $s in
    capture)  stage capture python3 benchmarks/capture_hw.py --out "$R/capture" --measure ;;
    profile)  stage profile sh -c "python3 -m autoopt profile --format json --measure > '$R/autoopt_profile.json'" ;;
    gputests) stage gputests python3 -m pytest -q -m gpu -p no:cacheprovider tests ;;
    ranking)  stage ranking python3 benchmarks/ranking_quality.py --grid benchmarks/results/h200_gemm_grid.json --out "$R/ranking.json" ;;
    bench)    TAIL=40 stage bench python3 -m autoopt bench --suite llm --out "$R/bench.json" --plot "$R/roofline.png" ;;
    norm)     stage norm python3 benchmarks/norm_choice.py --out "$R/norm.json" ;;
    stream)   stage stream python3 benchmarks/stream_sweep.py --out "$R/stream.json" ;;
    m256)     stage m256 python3 benchmarks/ranking_quality.py --grid benchmarks/results/h200_gemm_grid.json --m 256 --top 40 --out "$R/ranking_m256_top40.json" ;;
    gemv16)   stage gemv16 python3 benchmarks/stream_sweep.py --only "gemv[16x" --best 25 --spread 15 --out "$R/stream_gemv16.json" ;;
    models)   stage models python3 benchmarks/model_checks.py --check all --out "$R/model_checks.json" ;;
    # several GPUs (nvidia-h200-x2 or larger): issue 15's scaling, each twice to see the host's spread
    fleet)    stage fleet sh -c "for i in 1 2; do python3 benchmarks/fleet_scaling.py --runs 0 all --top 10 --out \"$R/fleet_scaling_\$i.json\"; done; python3 benchmarks/fleet_scaling.py --cli tune --runs 0 all --trials 6 --out '$R/fleet_cli_tune.json'; python3 -m autoopt fleet --measure --format json > '$R/fleet.json'" ;;
    # issue 29 on 2 or 4 GPUs of one host: where transformers' tensor-parallel step goes, and the regret tables
    tptrace)  stage tptrace python3 -m torch.distributed.run --standalone --nproc_per_node "${GPUS:-2}" benchmarks/tp_trace.py --batches "${BATCHES:-1,8,32}" --out "$R/tp_trace_${GPUS:-2}gpu.json" ;;
    # (BUDGET=S: batch by batch, the GPU layouts too, no batch started that would end past S seconds)
    regret)   stage regret python3 -m autoopt check regret --model llama-3-8b --layers 8 --gpus "${GPUS:-1}" ${BATCHES:+--batches "$BATCHES"} ${BUDGET:+--budget-s "$BUDGET"} --out "$R/regret_${GPUS:-1}gpu_layers8${BATCHES:+_b${BATCHES//,/_}}.json" ;;
    # issue 28: export moe-configs --tune on one GPU, on all (compile-ahead pool of 8), on all with a pool of POOL
    moescale) TAIL=8 stage moescale python3 benchmarks/moe_tune_scaling.py --pool "${POOL:-16}" --out "$R/moe_tune_scaling.json" ;;
    # issue 28: int4 experts (vLLM's int4_w4a16) tuned on this GPU with autoopt's kernel
    moeint4)  stage moeint4 python3 -m autoopt export moe-configs --model mixtral-8x7b --tp 8 --dtype int4_w4a16 --tune --no-store --out "$R/moe_int4" ;;
    # issue 28: optimize() on the MoE models (bf16 experts, int4 and fp8 experts) against transformers' experts
    moee2e)   TAIL=30 stage moee2e python3 benchmarks/moe_e2e.py --out "$R/moe_e2e.json" ;;
    # issue 28: where optimize()'s MoE prefill loses to grouped_mm (top kernels, host enqueue), bf16 only
    moeprefill) TAIL=30 stage moeprefill python3 benchmarks/moe_e2e.py --variants eager,grouped_mm,autoopt --trace-prefill --out "$R/moe_e2e_prefill_trace.json" ;;
    # issue 28: the MoE prefill against grouped_mm after the RMSNorm triton_op, bf16, both models (~4 min)
    moepre)   TAIL=30 stage moepre python3 benchmarks/moe_e2e.py --variants grouped_mm,autoopt --budget-s "${BUDGET:-200}" --out "$R/moe_e2e_rmsnorm_op.json" ;;
    # issue 28: the runtime's own kernel under each config set (carry .vllm; ~5-9 min: run it alone in a call).
    # CASES=4,5,6,7 runs the cases the 2026-11-27 run did not reach
    mrc)      stage mrc python3 benchmarks/moe_runtime_configs.py --vllm-src .vllm ${CASES:+--cases "$CASES"} --out "$R/moe_runtime_configs.json" ;;
    # the same timed replayed from CUDA graphs over shifted routings (the M = 1 points otherwise time the host)
    # (--budget-s 400: the 2026-11-28 run of the default 520 ran past the call's 600 s in its last point)
    mrcg)     stage mrcg python3 benchmarks/moe_runtime_configs.py --vllm-src .vllm --graph --budget-s 400 ${CASES:+--cases "$CASES"} --out "$R/moe_runtime_configs_graph.json" ;;
    # issue 29: NCCL all-reduce against message size on this host's GPUs (GPUS of them), graph-replayed (~30 s)
    nccl)     stage nccl python3 -m torch.distributed.run --standalone --nproc_per_node "${GPUS:-2}" benchmarks/nccl_allreduce.py --out "$R/nccl_allreduce_tp${GPUS:-2}.json" ;;
    # issue 27: where int4's 1 x 2048 prefill goes by kernel: bf16 + compile, int4 eager, int4 + compile (~4 min)
    i4prefill) TAIL=60 stage i4prefill python3 benchmarks/e2e_prefill_profile.py --weights int4 --top 20 --out "$R/prefill_profile_int4.json" ;;
    # the same into a fresh DynamicCache (model(ids)): optimize()'s causal_mask leaves SDPA causal under compile
    i4prefillc) TAIL=60 stage i4prefillc python3 benchmarks/e2e_prefill_profile.py --weights int4 --use-cache --top 12 --out "$R/prefill_profile_int4_cache.json" ;;
    # issue 27: the prefill's dequantization pass alone per tile, this tree's kernel against OLD (an earlier text of
    # quant_dequant.py, carried untracked) on int4, int8 too; then the kernel's GPU tests (~2 min)
    dequant)  stage dequant python3 benchmarks/probes/dequant_probe.py ${OLD:+--old "$OLD"} --out "$R/dequant_probe.json"
              stage dequanttests python3 -m pytest -q -p no:cacheprovider tests/test_quant_kernels.py -k dequant ;;
    # issue 27: the dequantize + cuBLAS path in row chunks whose scratch stays in L2, against the whole matrix (~1 min)
    dequantchunk) stage dequantchunk python3 benchmarks/probes/dequant_chunk_probe.py --out "$R/dequant_chunk_probe.json" ;;
    # issue 29: a second model and a fourth batch, toward 20 measured workloads
    regret2)  stage regret2 python3 -m autoopt check regret --model qwen2.5-7b --layers 8 --batches "${BATCHES:-1,8,16,32}" --gpus "${GPUS:-1}" ${BUDGET:+--budget-s "$BUDGET"} --out "$R/regret_qwen_${GPUS:-1}gpu_layers8.json" ;;
    # issue 29: where the batch-32 graphed step's time goes (predicted 0.62-0.70 of measured), eager and compiled
    b32trace) stage b32trace python3 benchmarks/quant_trace.py --batch 32 --layers 8 --formats autoopt-bf16,fp8 --out "$R/quant_trace_b32_layers8.json" ;;
    # issue 29: the Qwen2.5-7B batch-32 graphed step where fp8 (picked) measured 7 % slower than bf16
    # (h200/regret_qwen_1gpu_layers8_run2.json): per kernel class, uncompiled as the harness runs it, Llama-3-8B's
    # beside it (where fp8 measured faster), same run (~2 min)
    qwentrace) stage qwentrace sh -c "for m in qwen2.5-7b llama-3-8b; do python3 benchmarks/quant_trace.py --model \$m --batch 32 --layers 8 --no-compile --formats autoopt-bf16,fp8 --out '$R/quant_trace_'\$m'_b32_layers8.json' || exit 1; done" ;;
    # issue 27: generate() and the compiled 1 x 2048 prefill (no cache, and into a fresh cache) of int4 and fp8
    # against bf16 + compile, each compiled prefill checked against eager first (alone in a call: on 2026-11-29 bf16
    # took 108 s and fp8 168 s, and --budget-s 400 skipped int4, ~170 s; 470 leaves it room inside the call's 600)
    qe2e)     TAIL=12 stage qe2e python3 benchmarks/quant_e2e.py --no-torchao --compiled-prefill --budget-s 470 --out "$R/quant_e2e.json" ;;
    # issues 27/29: the batched-decode GEMMs (M = 32) of int4 and fp8, top 3 configs a linear: the two-stage price
    # and the FP8 mma.sync load depth (templates/quant.py) against what the picks measure, graph-replayed (~30 s)
    qk32)     stage qk32 python3 benchmarks/quant_kernels.py --parts decode --decode-m 32 --formats int4,fp8 --top 3 --no-torchao --graph --out "$R/quant_kernels_m32_graph.json" ;;
    # issues 27/29: the swapped batched-decode GEMV (quant_gemv_swap) against quant_gemv at M = 8, rank()'s top 3 of
    # each kernel per linear, three formats, graph-replayed (~2 min); then its kernel tests compiled on this GPU
    # (M=16 TOP=8: the token tile of 16, two halves of 8, against quant_gemv's 16-row dot)
    qswap)    stage qswap python3 benchmarks/quant_kernels.py --formats int4,fp8,int8 --parts decode --decode-m "${M:-8}" --shapes qkv,o,gate_up,down --top "${TOP:-3}" --per-path --rep-ms 30 --no-torchao --graph --out "$R/quant_kernels_m${M:-8}_swap_graph.json"
              stage swaptests python3 -m pytest -q -p no:cacheprovider tests/test_quant_gemv_swap.py ;;
    # the swapped GEMV's probe: its grid against rank()'s quant_gemv picks (benchmarks/probes/gemv_swap_probe.py)
    swapprobe) stage swapprobe python3 benchmarks/probes/gemv_swap_probe.py --rep-ms 15 --budget-s 440 --out "$R/gemv_swap_probe.json" ;;
    # the package's kernel over the same grid at 16 tokens (two halves of 8), beside quant_gemv's picks (~3-4 min)
    swap16)   stage swap16 python3 benchmarks/probes/gemv_swap_probe.py --kernel tree --no-native --m 16 --rep-ms 15 --budget-s 300 --out "$R/gemv_swap_probe_m16_tree.json" ;;
    # at 32 tokens (four eighths) for the weight-only formats, then 8 again (the same kernel source), ~4-5 min
    swap32)   stage swap32 python3 benchmarks/probes/gemv_swap_probe.py --kernel tree --no-native --formats int4,int8 --m 32,8 --rep-ms 15 --budget-s 320 --out "$R/gemv_swap_probe_m32_tree.json" ;;
    # issue 27: int4's decode GEMV (M = 1) over its FMA-path grid and rank()'s top 3 a path, on Llama-3-8B's four
    # linears: where rank()'s pick stands against the grid's best on this GPU (~50 s on an H100)
    # (--graph: each timed replayed from a CUDA graph, as the decode step runs: events timed this H200's host)
    qfma)     stage qfma python3 benchmarks/quant_kernels.py --formats int4 --parts decode --shapes qkv,o,gate_up,down --top 3 --per-path --fma-grid --rep-ms 30 --no-torchao --graph --out "$R/quant_kernels_fmagrid_graph.json" ;;
    # the same for fp8 (W8A8 at M = 1 runs the FMA path on bf16 activations), its per-row grid (~2 min)
    qfma8)    stage qfma8 python3 benchmarks/quant_kernels.py --formats fp8 --parts decode --shapes qkv,o,gate_up,down --top 3 --per-path --fma-grid --rep-ms 30 --no-torchao --graph --out "$R/quant_kernels_fp8_grid_graph.json" ;;
    qfmab)    stage qfmab python3 benchmarks/quant_kernels.py --formats int4 --parts decode --shapes qkv,o,gate_up,down --top 3 --per-path --fma-grid --rep-ms 30 --no-torchao --graph --no-int4-words --out "$R/quant_kernels_fmagrid_graph_bytes.json" ;;
    # issue 27: the runner's (autoopt tune's) graph-replayed, rotated timing of rank()'s int4 decode GEMV picks (~20 s)
    qrun)     stage qrun sh -c "python3 benchmarks/probes/quant_gemv_runner.py --top 3 > '$R/quant_gemv_runner.json'" ;;
    # issue 27: A/B of candidate changes to optimize()'s compiled decode step (norm left to Inductor, longer DRAM
    # runs in the GEMV price), graphed step and generate() per variant, bf16 + compile first and last (~7 min: alone)
    qvar)     TAIL=12 stage qvar python3 benchmarks/probes/step_variants.py --formats int4 --budget-s 420 --out "$R/step_variants.json" ;;
    # issue 27: optimize()'s fused decode layers against the plain compiled step, int4, generate() and the graphed step, bf16 +
    # compile first and last (~7 min: alone); then the same three per kernel class (quant_trace, ~4 min: alone)
    qfused)   TAIL=12 stage qfused python3 benchmarks/probes/step_variants.py --formats int4 --variants base,decode_layer --budget-s 420 --out "$R/step_variants_decode_layer.json" ;;
    qfusedtrace) stage qfusedtrace python3 benchmarks/quant_trace.py --formats int4,int4+decode_layer --steps 3 --out "$R/quant_trace_decode_layer.json" ;;
    # the chains of the fused decode kernels alone, int4 and fp8 (~20 s each)
    qchain)   stage qchain sh -c "python3 benchmarks/probes/fused_chain_probe.py --out '$R/fused_chain_int4.json' && python3 benchmarks/probes/fused_chain_probe.py --format fp8 --out '$R/fused_chain_fp8.json'" ;;
    # issue 27: whether the GPU waits for the host's graph launch between tokens (the step's graph synced one at a
    # time against back to back), and where generate()'s per-token host time goes on this host (~4 min)
    glaunch)  stage glaunch sh -c "python3 benchmarks/probes/graph_launch.py --out '$R/graph_launch.json' && python3 benchmarks/probes/generate_host.py --formats int4 --out '$R/generate_host.json'" ;;
    # issue 27: the decode-graph call's host time inside generate(), split (signature, copies, replay) (~2 min)
    rhost)    stage rhost python3 benchmarks/probes/replay_host.py --out "$R/replay_host.json" ;;
    # issue 27: autoopt's decode attention kernel (every config of its grid) against the cuDNN SDPA transformers runs,
    # checked, graph-replayed, same process (~1 min)
    dattn)    stage dattn python3 benchmarks/probes/decode_attention_probe.py --out "$R/decode_attention_probe.json" ;;
    # issue 27: the decode attention's GPU tests: bf16 kernel, eager generate(), the traced launch under
    # torch.compile (the path compiled decode steps take), the compiled decode graph (~1-2 min)
    attngpu)  stage attngpu python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_decode_attention.py ;;
    # issue 27: where int4's decode step goes, per kernel class, eager and compiled, full model (~80 s)
    qtrace)   stage qtrace python3 benchmarks/quant_trace.py --formats int4 --out "$R/quant_trace_int4.json" ;;
    qtrace8)  stage qtrace8 python3 benchmarks/quant_trace.py --formats fp8 --out "$R/quant_trace_fp8.json" ;;
    qtraceb)  stage qtraceb python3 benchmarks/quant_trace.py --formats int4 --no-int4-words --out "$R/quant_trace_int4_bytes.json" ;;
    # issue 29: generate()'s per-token host time over the graphed compiled step, for GENERATE_HOST_US
    hostfit)  stage hostfit python3 benchmarks/probes/generate_host.py --formats int4,fp8,bf16 --out "$R/generate_host_fit.json" ;;
    *) echo "unknown stage $s" ;;
  esac
done
# a second invocation in the same call packs beside the first's (results_2.tgz, ...), never over it
cd "$OUT" && pack=results.tgz && n=1 && while [ -e "$pack" ]; do n=$((n + 1)); pack=results_$n.tgz; done
tar czf "$pack" r && rm -rf r
