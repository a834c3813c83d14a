#!/usr/bin/env bash
# The GPU runs behind docs/performance.md, on the GPU machine (see README: Performance).
# First, on a machine with network: bash tools/gpu_prep.sh (fills .whl/, .redis/ and .peer/; the wheel
# list is tools/gpu_wheels.txt), then carry those three folders with the working tree.
# Usage: bash tools/gpu_run.sh OUTDIR PART...
#   PART: tests | kernels | blas | kernel-sweep | split-sweep | engine | engine-int8 | profile | offline | static | pipeline | peer | trace
#         quant | quant-tests   (issue 47's FP8: bf16, FP8 KV and FP8 weights in one job; the FP8 and int4 GPU tests)
#         quant-int4 | quant-gemm   (bf16 against AWQ int4 weights in one job; each projection's bf16, FP8 and int4
#         GEMM at M = 1 to 256 against its bytes-moved floor)
#         quant-sweep   (the FP8 and int4 GEMMs' tiles, warps, stages and split at each projection and M = 1, 4, 16:
#         the best against the default, and the table literal for services/worker/kernels/gemm_tiles.py)
#         cache-prefix | cache-turns | cache-offline | cache-routing | cache-pipeline   (the prompt cache, issue 44:
#         each on and off, or under both router policies, in one run; cache-routing runs two groups on the one GPU;
#         cache-pipeline: WORKLOAD (shared_prefix, or multi_turn) through the whole pipeline, one group, on and off)
#         structured   (issue 48: the fixed workload under JSON schemas against unconstrained, one stack)
#         families-tests | families | families-rest   (issue 45: each family's 1B model in bf16 against Hugging
#         Face fp32; Qwen3-8B's decode step against Llama-3-8B's, then the four benchmark families against
#         the peer; the other six against the peer); families-small-vocab: FAMILIES (default the three whose
#         vocabulary is under the peer's prompt ids; bench_families.py folds them in through tools/peer_vocab.py;
#         REQUESTS: how many of the fixed workload's requests, default 16)
#         moe   (the fused experts at Mixtral's and Qwen3-30B-A3B's shapes, 1 to 4096 tokens: time, and against the reference)
#         moe-fp8   (the same with FP8 experts beside bf16; the FP8 kernel's GPU tests and the tiny MoEs' FP8 engines)
#         vision   (issue 49: LLaVA-1.5-7B and Qwen2.5-VL-7B shapes, image requests through the stack with two
#         visual replicas then one, the encoder against the matmul rate, the Hugging Face peer, in one job;
#                  VISION_FAMILIES=llava or qwen2_5_vl runs one, for a call of at most 10 minutes)
#         tp-tests | tp | dp   (these three need 2 GPUs: TP=2 against TP=1, a TP=2 group, two data-parallel groups)
set -u
out=${1:?OUTDIR}; shift
mkdir -p "$out"
export PYTHONUNBUFFERED=1 PYTHONPATH="/tmp/site:$PWD" LD_LIBRARY_PATH="$PWD/.redis:${LD_LIBRARY_PATH:-}"
if [ -d .whl ]; then  # every time: a machine still warm from an earlier call may lack a wheel added since
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
fi
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem --format=csv | tee "$out/gpu.txt"
# SM clock, power and temperature every 200 ms while a part runs (batch 256 decodes at the power
# cap, and its step moves by up to 3 ms between engines of one job)
smi_log() { nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,clocks_throttle_reasons.active \
              --format=csv -lms 200 > "$out/clocks-$1.csv" 2>&1 & smi=$!; }
for part in "$@"; do
  start=$(date +%s)
  smi_log "$part"
  case $part in
    tests) timeout 200 python3 -m pytest -m gpu tests/kernels tests/worker -q -p no:cacheprovider -rA 2>&1 \
             | grep -v "^PASSED\|^$" | tail -60 | tee "$out/gpu_tests.log" ;;
    kernels) timeout 150 python3 tools/bench_kernels.py --out "$out/kernels.json" > "$out/kernels.log" 2>&1; tail -5 "$out/kernels.log" ;;
    blas) timeout 200 python3 tools/bench_blas.py --out "$out/blas.json" 2>&1 | grep -v Warning | tail -3 ;;
    split-sweep) timeout 300 python3 tools/bench_kernels.py --split-sweep --out "$out/split_sweep.json" > "$out/split_sweep.log" 2>&1; grep "split sweep\|Error" "$out/split_sweep.log" | tail -20 ;;
    kernel-sweep) timeout 420 python3 tools/bench_kernels.py --sweep --out "$out/kernels_sweep.json" > "$out/kernels_sweep.log" 2>&1; tail -30 "$out/kernels_sweep.log" ;;
    engine) timeout 230 python3 tools/benchmark_engine.py --out "$out/engine.json" 2>&1 | grep -v "it/s\]" | tail -20 ;;
    profile) timeout 200 python3 tools/profile_decode.py --out "$out/profile.json" 2>&1 | grep -v "it/s\]" | tail -45 ;;
    offline) timeout 200 python3 tools/benchmark_engine.py --parts offline --running-max-req-size 2048 --out "$out/offline.json" 2>&1 | grep -v "it/s\]" | tail -4 ;;
    static) timeout 100 python3 tools/benchmark_engine.py --parts ceilings,static --out "$out/static.json" 2>&1 | grep -v "it/s\]" | tail -6 ;;
    pipeline) timeout 500 python3 tools/bench_pipeline.py --out-dir "$out" --redis-server "$PWD/.redis/redis-server" \
                --low-load "${LOW_LOAD:-100}" 2>&1 \
                | grep -v "it/s\]" | tail -12
              tar czf "$out/logs.tgz" -C /tmp/lightstream-bench logs 2>/dev/null ;;
    trace) timeout 200 python3 tools/trace_lowload.py --device cuda --requests 12 --redis-server "$PWD/.redis/redis-server" \
             --out "$out/trace.json" 2>&1 | grep -v "it/s\]" | tail -2 ;;
    peer) timeout 280 python3 .peer/peer_hf.py --requests 300 --skip static_b1,static_b64 --out "$out/peer_hf.json" 2>&1 | tail -6 ;;
    quant) timeout 590 python3 tools/bench_quant.py --variants "${VARIANTS:-bf16,kv-fp8,fp8}" --static 1x1024,64x1024 \
             --running-max-req-size 2048 \
             --out "$out/quant.json" 2>&1 | grep -v "it/s\]" | grep -v " INFO " | tail -20 ;;
    quant-tests) timeout 580 python3 -m pytest -m gpu -q -s -p no:cacheprovider -rA tests/worker/models/test_fp8_product.py \
                   tests/worker/test_cuda_path.py tests/worker/test_quant_vs_hf.py tests/kernels/test_kv_store.py \
                   tests/kernels/test_decode_attention.py tests/kernels/test_extend_attention.py \
                   tests/kernels/test_fp8_quant_rows.py tests/kernels/test_fp8_weight_matmul.py \
                   tests/kernels/test_int4_matmul.py tests/kernels/test_split_k_sum.py 2>&1 \
                   | grep -v "it/s\]\|^$\|^PASSED" | tail -40 | tee "$out/quant_tests.log" ;;
    quant-int4) timeout 590 python3 tools/bench_quant.py --variants bf16,awq --parts ceilings,static --static 1x1024,64x1024 \
                  --running-max-req-size 2048 --out "$out/quant_int4.json" 2>&1 | grep -v "it/s\]" | grep -v " INFO " | tail -20 ;;
    quant-gemm) timeout 300 python3 tools/bench_kernels.py --parts ceilings,quant_gemm --out "$out/quant_gemm.json" \
                  > "$out/quant_gemm.log" 2>&1; grep " us$\|Error" "$out/quant_gemm.log" | tail -20 ;;
    quant-sweep) timeout 300 python3 tools/kernel_quant_sweep.py --rows "${ROWS:-1,4,16}" --variants "${SWEEP_VARIANTS:-fp8,int4}" \
                   --out "$out/quant_sweep.json" > "$out/quant_sweep.log" 2>&1
                 grep "^round\|M=\|swept\|Tile\|^}\|Error" "$out/quant_sweep.log" | tail -64 ;;
    engine-int8) timeout 300 python3 tools/benchmark_engine.py --kv-dtype int8 --parts static,offline --out "$out/engine_int8.json" 2>&1 | tail -8 ;;
    tp-tests) timeout 300 python3 -m pytest -m gpu tests/worker/test_tp_cuda.py -q -s -p no:cacheprovider -rA 2>&1 \
                | grep -v "it/s\]\|^$" | tail -25 | tee "$out/tp_tests.log" ;;
    tp) timeout 300 python3 tools/benchmark_engine.py --tp 2 --parts ceilings,static,offline --static 1x1024,64x1024,256x1024 \
          --running-max-req-size 2048 --out "$out/tp2.json" 2>&1 | grep -v "it/s\]" | grep -v " INFO " | tail -8 ;;
    cache-prefix) timeout 580 python3 tools/benchmark_engine.py --parts shared_prefix,shared_prefix_rate --prompt-cache on,off \
                    --running-max-req-size 2048 --out "$out/cache_prefix.json" 2>&1 | grep -v "it/s\]" | grep -v " INFO " | tail -12 ;;
    cache-turns) timeout 580 python3 tools/benchmark_engine.py --parts multi_turn --prompt-cache on,off \
                   --running-max-req-size 2048 --out "$out/cache_turns.json" 2>&1 | grep -v "it/s\]" | grep -v " INFO " | tail -6 ;;
    cache-offline) timeout 580 python3 tools/benchmark_engine.py --parts offline --prompt-cache on,off \
                     --running-max-req-size 2048 --out "$out/cache_offline.json" 2>&1 | grep -v "it/s\]" | grep -v " INFO " | tail -6 ;;
    cache-routing) timeout 580 python3 tools/bench_prompt_cache.py --out-dir "$out" --redis-server "$PWD/.redis/redis-server" \
                     --workload shared_prefix --policies cache_aware,round_robin --groups 2 --gpus-per-group 0 \
                     --kv-tokens "${KV_TOKENS:-100000}" 2>&1 | grep -v "it/s\]" | tail -6
                   tar czf "$out/cache_logs.tgz" -C /tmp/lightstream-bench-cache logs 2>/dev/null ;;
    cache-pipeline) timeout 580 python3 tools/bench_prompt_cache.py --out-dir "$out" --redis-server "$PWD/.redis/redis-server" \
                      --workload "${WORKLOAD:-shared_prefix}" --policies default --prompt-cache on,off --groups 1 2>&1 \
                      | grep -v "it/s\]" | tail -6 ;;
    structured) timeout 580 python3 tools/bench_structured.py --out-dir "$out" --redis-server "$PWD/.redis/redis-server" 2>&1 \
                  | grep -v "it/s\]" | tail -12
                tar czf "$out/structured_logs.tgz" -C /tmp/lightstream-bench-structured logs 2>/dev/null ;;
    families-tests) timeout 240 python3 -m pytest -m gpu tests/worker/test_cuda_path.py -k test_1b_bf16 -q -s \
                      -p no:cacheprovider -rA 2>&1 | grep "agreement\|passed\|failed\|Error" | tail -90 \
                      | tee "$out/families_tests.log" ;;
    families) timeout 580 python3 tools/bench_families.py --out "$out/families.json" --requests 16 \
                --families qwen3,gemma2,mixtral,qwen3_moe --peer-timeout 150 2>&1 | tail -6 ;;
    families-rest) timeout 580 python3 tools/bench_families.py --out "$out/families_rest.json" --requests 16 \
                     --families llama,mistral,qwen2,phi3,gemma3,qwen2_moe --decode-shapes "" --peer-timeout 100 2>&1 \
                     | tail -6 ;;
    families-small-vocab) timeout 580 python3 tools/bench_families.py --out "$out/families_small_vocab.json" \
                            --requests "${REQUESTS:-16}" --families "${FAMILIES:-mistral,phi3,mixtral}" --decode-shapes "" \
                            --peer-timeout 150 2>&1 | tail -6 ;;
    moe) for shape in mixtral-8x7b qwen3-30b-a3b; do
           timeout 150 python3 tools/bench_moe.py --shape $shape --out "$out/moe-$shape.json" > "$out/moe-$shape.log" 2>&1
           tail -12 "$out/moe-$shape.log"; done
         timeout 200 python3 -m pytest -m gpu -q -s -p no:cacheprovider tests/kernels/test_fused_moe.py -k real_shapes 2>&1 \
           | grep "T=\|passed\|failed\|Error" | tee "$out/moe_tests.log" | tail -20 ;;
    moe-fp8) for shape in mixtral-8x7b qwen3-30b-a3b; do
               timeout 300 python3 tools/bench_moe.py --fp8 --shape $shape --out "$out/moe-fp8-$shape.json" \
                 > "$out/moe-fp8-$shape.log" 2>&1
               tail -24 "$out/moe-fp8-$shape.log"; done
             timeout 400 python3 -m pytest -m gpu -q -s -p no:cacheprovider tests/kernels/test_fused_moe_fp8.py \
               tests/worker/test_cuda_path.py -k "fp8 and (real_shapes or graph or moe)" 2>&1 \
               | grep "T=\|passed\|failed\|Error" | tee "$out/moe_fp8_tests.log" | tail -20 ;;
    vision) timeout 580 python3 tools/bench_vision.py --out-dir "$out" --redis-server "$PWD/.redis/redis-server" \
              --families "${VISION_FAMILIES:-llava,qwen2_5_vl}" --requests 64 --encode-requests 256 --visuals 2,1 --peer-timeout 170 2>&1 \
              | grep -v "it/s\]" | grep "^llava\|^qwen\|^matmul\|Error" | tail -16
            tar czf "$out/vision_logs.tgz" -C /tmp/lightstream-bench-vision logs 2>/dev/null ;;
    dp) timeout 240 python3 tools/bench_data_parallel.py --groups 2 --out "$out/dp2.json" -- --running-max-req-size 2048 2>&1 | tail -3 ;;
    *) echo "unknown part $part" ;;
  esac
  kill "$smi" 2>/dev/null
  echo "== $part took $(( $(date +%s) - start ))s"
done
