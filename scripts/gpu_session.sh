#!/usr/bin/env bash
# One run on a GPU host: GPU correctness of the engine against PEFT and the engine benchmark.
# Run from the repository root on a CUDA machine with torch, triton, transformers and peft, with
# .device_pkg/ beside it (scripts/device_package.sh builds it: the tokenizer and the other wheels).
# Usage: scripts/gpu_session.sh [gpu-tests (GPU_SHARD=I/N, GPU_TESTS, GPU_WORKERS, GPU_DIST, GPU_SESSION_TIMEOUT)] [engine-tests|engine-fidelity] [engine-bench] [bench-latency] [prefill-profile] [prefill-lora-bench] [prefill-ab] [engine-bench-invariant] [api-bench] [logprobs-bench] [engine-bench-ab] [engine-bench-qkv] [lora-step] [tier-bench] [tier-ab] [tier-trace] [tier-workers] [bench-sweep-steps] [bench-suite] [bench-ranks] [bench-sweep-prefetch] [bench-peft] [bench-many-adapters] [bench-queue-depth] [quant-tests] [quant-bench] [quant-candidates] [swap-bench] [prefix-cache] [prefix-step]
#        [kernel-tests] [kernel-bench] [attention-bench]   (KERNEL_SECTIONS, KERNEL_BUDGET, KERNEL_TESTS)
# Kernel benchmarks run from benchmarks/kernels/ (python -m benchmarks.kernels.NAME, from the repository root).
set -u
OUT=${OUT:-/tmp/gpu-session}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
if [ -d .device_pkg/whl ]; then
  python3 -m pip install -q --no-index --no-deps --target /tmp/site .device_pkg/whl/*.whl >/dev/null 2>&1
  export PYTHONPATH=$PWD:/tmp/site
else
  export PYTHONPATH=$PWD
fi
python3 -c 'import torch, triton, transformers, peft; print("torch", torch.__version__, "triton", triton.__version__, "transformers", transformers.__version__, "peft", peft.__version__, torch.cuda.get_device_name())' | tee "$OUT/versions.txt"
steps=${*:-engine-tests engine-bench}
for step in $steps; do
  echo "=== $step"
  start=$(date +%s)
  case $step in
    engine-tests)
      TRITON_INTERPRET=0 MULTILORA_TEST_DEVICE=cuda MULTILORA_TEST_TOKENIZER_DIR=$PWD/.device_pkg/tokenizer \
        timeout ${ENGINE_TESTS_TIMEOUT:-420} python3 -m pytest -q -x -p no:cacheprovider tests/engine/test_fidelity.py \
        tests/engine/test_model_families.py tests/engine/test_engine_behaviour.py tests/engine/test_kernel_warmup.py \
        tests/engine/test_step_graphs.py tests/engine/test_diagnostics.py tests/engine/test_lora_plan_builder.py \
        tests/engine/test_logprobs.py \
        2>&1 | tee "$OUT/engine-tests.log" | tail -25 ;;
    engine-bench)
      timeout 400 python3 -m benchmarks.engine_gpu --rounds ${ENGINE_BENCH_ROUNDS:-3} --json "$OUT/engine_gpu.json" 2>&1 \
        | tee "$OUT/engine-bench.log" | grep -v "^INFO" | tail -30 ;;
    bench-latency)
      # single stream, TTFT of 2,048 tokens, prefill 16 x 1,024 over 4 adapters, batch 32 end to
      # end, each with adapters against the base (multilora-studio bench latency, full sizes)
      timeout ${LATENCY_TIMEOUT:-300} python3 -m multilora_studio bench latency --model random:llama3-8b \
        --device cuda --dtype bfloat16 --rank 16 --targets all --max-loras 32 --rounds ${LATENCY_ROUNDS:-3} \
        --no-progress --json "$OUT/bench_latency.json" 2>&1 | tee "$OUT/bench-latency.log" | grep -v " INFO " | tail -20 ;;
    prefill-profile)
      # the kernels of a 2,048-token prompt and of 16 x 1,024 prompts, base and with adapters (torch profile)
      timeout ${PROFILE_TIMEOUT:-200} python3 -m benchmarks.prefill_profile_gpu --json "$OUT/prefill_profile.json" 2>&1 \
        | tee "$OUT/prefill-profile.log" | grep -v "^INFO" | tail -70 ;;
    prefill-ab)
      # TTFT of 2,048 tokens and prefill of 16 x 1,024 over 4 adapters with the engine's plan and
      # with the shrink in the GEMM over a narrow slot span (PREFILL_AB_ROWS A rows a slice), alternating
      timeout ${PREFILL_AB_TIMEOUT:-240} python3 -m benchmarks.prefill_ab_gpu --rows ${PREFILL_AB_ROWS:-64} \
        --json "$OUT/prefill_ab.json" 2>&1 | tee "$OUT/prefill-ab.log" | grep -v "^INFO" | tail -6 ;;
    prefill-lora-bench)
      # the LoRA shrink and expand at prefill sizes against the base GEMMs, with their tiles swept
      timeout ${PREFILL_LORA_TIMEOUT:-200} python3 -m benchmarks.kernels.prefill_lora_bench \
        --budget ${PREFILL_LORA_BUDGET:-120} --json "$OUT/prefill_lora.json" 2>&1 | tee "$OUT/prefill-lora.log" | tail -12 ;;
    engine-bench-invariant)
      # the engine benchmark in the default mode, then batch-invariant (one round each, one after the other)
      for flag in "" --batch-invariant; do
        timeout 280 python3 -m benchmarks.engine_gpu --rounds 1 $flag --json "$OUT/engine_gpu${flag:+_invariant}.json" \
          2>&1 | tee "$OUT/engine-bench${flag:+-invariant}.log" | grep -v "^INFO" | tail -40
      done ;;
    api-bench)
      # structured output (half the rows under a JSON schema) and the logits processors (every row),
      # each against the same batch without, alternating rounds
      timeout 280 python3 -m benchmarks.structured_gpu --json "$OUT/structured_gpu.json" 2>&1 \
        | tee "$OUT/structured-bench.log" | grep -v "^INFO" | tail -12
      timeout 280 python3 -m benchmarks.sampling_gpu --json "$OUT/sampling_gpu.json" 2>&1 \
        | tee "$OUT/sampling-bench.log" | grep -v "^INFO" | tail -12 ;;
    gpu-tests)
      # the whole GPU test set natively: kernel, engine and server tests on CUDA, no interpreter.
      # scripts/gpu_tests.py lists its files (or GPU_TESTS': files or folders) less those whose
      # imports the GPU host lacks (lm-evaluation-harness, LangChain, litellm: their tests run in CI);
      # GPU_SHARD=I/N runs the I-th of N parts, so that N runs, each within a time limit, cover it all;
      # GPU_WORKERS pytest-xdist processes (8) share the one GPU, a test file each at a time
      # (GPU_DIST=load: a test each, for a few long files); past
      # GPU_SESSION_TIMEOUT (480 s) no test starts, so the summary and $OUT/gpu-tests.xml still come
      if files=$(python3 scripts/gpu_tests.py --shard "${GPU_SHARD:-1/1}" ${GPU_TESTS:-}); then
        # shellcheck disable=SC2086
        TRITON_INTERPRET=0 MULTILORA_TEST_DEVICE=cuda MULTILORA_TEST_TOKENIZER_DIR=$PWD/.device_pkg/tokenizer \
          timeout ${GPU_TESTS_TIMEOUT:-575} python3 -m pytest -q -rfE -p no:cacheprovider \
          -n "${GPU_WORKERS:-8}" --dist "${GPU_DIST:-loadfile}" --durations=25 --session-timeout "${GPU_SESSION_TIMEOUT:-480}" \
          --junitxml "$OUT/gpu-tests.xml" $files 2>&1 \
          | tee "$OUT/gpu-tests.log" | tail -25
      fi ;;
    logprobs-bench)
      # decode with logprobs=5 and prompt scoring (prompt_logprobs=1), each against the same run without
      timeout 400 python3 -m benchmarks.logprobs_gpu --json "$OUT/logprobs_gpu.json" 2>&1 \
        | tee "$OUT/logprobs-bench.log" | grep -v "^INFO" | tail -8 ;;
    engine-bench-ab)
      # the engine benchmark with the LoRA shrink inside the base GEMMs off, then on
      for mode in ${AB_MODES:-off on}; do
        timeout 280 python3 -m benchmarks.engine_gpu --shrink-in-gemm $mode \
          --json "$OUT/engine_gpu_$mode.json" 2>&1 | tee "$OUT/engine-bench-$mode.log" | grep -v "^INFO" \
          | grep -E "shrink|fused_qkv|decode_tok|over_base|replay|startup|equals|fraction|rounds"
      done ;;
    engine-bench-qkv)
      # the engine benchmark with q/k/v's expand, RoPE and the cache write as separate launches, then fused
      for fused in off on; do
        timeout 280 python3 -m benchmarks.engine_gpu --fused-qkv-epilogue $fused \
          --json "$OUT/engine_gpu_qkv_$fused.json" 2>&1 | tee "$OUT/engine-bench-qkv-$fused.log" | grep -v "^INFO" \
          | grep -E "fused_qkv|decode_tok|over_base|replay|startup|equals|fraction|rounds"
      done ;;
    prefix-cache)
      # the prefix cache on CUDA: its engine tests, then time to first token over a 4,000-token
      # shared prefix, four-choice scoring and decode with nothing shared, each against the cache off
      TRITON_INTERPRET=0 MULTILORA_TEST_DEVICE=cuda MULTILORA_TEST_TOKENIZER_DIR=$PWD/.device_pkg/tokenizer \
        timeout ${PREFIX_TESTS_TIMEOUT:-240} python3 -m pytest -q -p no:cacheprovider -n 4 tests/engine/test_prefix_cache.py \
        tests/engine/test_prefix_cache_blocks.py 2>&1 | tee "$OUT/prefix-tests.log" | tail -8
      timeout ${PREFIX_BENCH_TIMEOUT:-300} python3 -m benchmarks.prefix_cache --model random:llama3-8b --device cuda \
        --dtype bfloat16 --prefix-len 4000 --questions 16 --context-len 1000 --decode-batch 32 --kv-cache-gb 12 \
        --rounds ${PREFIX_ROUNDS:-3} --json "$OUT/prefix_cache.json" 2>&1 | tee "$OUT/prefix-cache.log" | grep -v INFO | tail -12 ;;
    prefix-step)
      # the attention of a short chunk after a long cached prefix (the warm request's step), one layer
      timeout 150 python3 -m benchmarks.kernels.paged_attention_bench --cached-prefix 2>&1 \
        | tee "$OUT/attention-cached.log" | tail -8 ;;
    tier-bench)
      timeout 200 python3 -m benchmarks.tiers_gpu --json "$OUT/tiers_gpu.json" 2>&1 \
        | tee "$OUT/tier-bench.log" | grep -v "^INFO" | tail -30 ;;
    tier-ab)
      # decode during cold loads with the thread loader and with the process loader
      for loader in thread process; do
        timeout 120 python3 -m benchmarks.tiers_gpu --skip-zipf --adapter-loader $loader \
          --json "$OUT/tiers_$loader.json" 2>&1 | tee "$OUT/tier-$loader.log" | grep -E "loader|decode|cold"
      done ;;
    tier-trace)
      # decode during cold loads with the step trace: four loads at once, then one
      for workers in 4 1; do
        timeout 150 python3 -m benchmarks.tiers_gpu --skip-zipf --load-workers $workers \
          --json "$OUT/tiers_trace_w$workers.json" 2>&1 | tee "$OUT/tier-trace-w$workers.log" \
          | grep -E "step trace|alone|cold|warm|ratio|loader|workers" | grep -v INFO
      done ;;
    tier-stacks)
      # decode during cold loads (four loads at once) with thread stacks sampled: what the slow steps waited on
      timeout 150 python3 -m benchmarks.tiers_gpu --skip-zipf --sample-stacks \
        --json "$OUT/tiers_stacks.json" 2>&1 | tee "$OUT/tier-stacks.log" | grep -v INFO \
        | grep -E "step trace|alone|cold|warm|ratio|slow|    |stalls" | head -90 ;;
    bench-sweep-steps)
      # 1 and 1000 adapters (Zipf 1.0, 32 slots), 256 requests, host tier empty; batch occupancy per case
      timeout 300 python3 -m multilora_studio bench --model random:llama3-8b --device cuda --dtype bfloat16 \
        --rank 16 --targets all --batch 32 --max-loras 32 --input-len 64 --output-len 32 \
        --sweep-adapters 1,1000 --requests 256 --no-progress --json "$OUT/bench_sweep_steps.json" 2>&1 \
        | tee "$OUT/bench-sweep-steps.log" | grep -v " INFO " | tail -8 ;;
    bench-sweep-w8)
      # 1 and 1000 adapters, host tier empty, eight disk loads at once (the default on 16 cores is four)
      timeout 300 python3 -m multilora_studio bench --model random:llama3-8b --device cuda --dtype bfloat16 \
        --rank 16 --targets all --batch 32 --max-loras 32 --input-len 64 --output-len 32 --load-workers 8 \
        --sweep-adapters 1,1000 --requests 256 --no-progress --json "$OUT/bench_sweep_w8.json" 2>&1 \
        | tee "$OUT/bench-sweep-w8.log" | grep -v " INFO " | tail -6 ;;
    lora-step)
      # what the LoRA term adds to a decode step's projections (32 layers, batch 32), per way of running it
      timeout 300 python3 -m benchmarks.kernels.step_lora_bench ${LORA_STEP_ARGS:-} 2>&1 \
        | tee "$OUT/lora-step.log" | tail -40 ;;
    bench-identical)
      # the identical pattern (every request on one adapter) with thread stacks of its slowest steps
      timeout 200 python3 -m multilora_studio bench --model random:llama3-8b --device cuda --dtype bfloat16 \
        --rank 16 --targets all --batch 32 --max-loras 32 --input-len 64 --output-len 32 \
        --pattern identical,uniform --sample-stacks --no-progress --json "$OUT/bench_identical.json" 2>&1 \
        | tee "$OUT/bench-identical.log" | grep -v " INFO " | tail -60 ;;
    tier-workers)
      # decode during cold loads with one loader thread and with four
      for workers in 1 4; do
        timeout 150 python3 -m benchmarks.tiers_gpu --skip-zipf --load-workers $workers \
          --json "$OUT/tiers_w$workers.json" 2>&1 | tee "$OUT/tier-w$workers.log" | grep -E "loader|decode|cold|upload"
      done ;;
    bench-sweep-process)
      # the adapter-count sweep again with the loader process
      timeout 240 python3 -m multilora_studio bench --model random:llama3-8b --device cuda --dtype bfloat16 \
        --rank 16 --targets all --batch 32 --max-loras 32 --input-len 64 --output-len 32 --adapter-loader process \
        --sweep-adapters 1,8,32,128,1000 --requests 128 --no-progress --json "$OUT/bench_sweep_process.json" 2>&1 \
        | tee "$OUT/bench-sweep-process.log" | grep -v " INFO " | tail -12 ;;
    bench-sweep-prefetch)
      # S-LoRA's setting for the adapter-count sweep: the most popular adapters in host RAM
      # (384 of them, about 32 GB pinned) before each case, and a longer run per case
      timeout 500 python3 -m multilora_studio bench --model random:llama3-8b --device cuda --dtype bfloat16 \
        --rank 16 --targets all --batch 32 --max-loras 32 --max-cpu-loras 384 --prefetch-host \
        --input-len 64 --output-len 32 --sweep-adapters 1,1000 --requests 512 --no-progress \
        --json "$OUT/bench_sweep_prefetch.json" 2>&1 | tee "$OUT/bench-sweep-prefetch.log" | grep -v " INFO " | tail -8 ;;
    bench-many-adapters)
      # steady state with 1, 1,000 and 10,000 adapters under Zipf 1.0, default settings (the host
      # tier sized from free host memory); LOAD_WORKERS overrides the loads at once
      timeout 450 python3 -m multilora_studio bench --model random:llama3-8b --device cuda --dtype bfloat16 \
        --rank 16 --targets all --batch 32 --max-loras 32 --input-len 64 --output-len 32 \
        --sweep-adapters ${SWEEP_ADAPTERS:-1,1000,10000} --requests 2048 ${LOAD_WORKERS:+--load-workers $LOAD_WORKERS} \
        --no-progress --json "$OUT/bench_many${LOAD_WORKERS:+_w$LOAD_WORKERS}.json" 2>&1 \
        | tee "$OUT/bench-many${LOAD_WORKERS:+-w$LOAD_WORKERS}.log" | grep -v " INFO " | tail -9 ;;
    quant-tests)
      # quantized bases on the device: gemlite's and cuBLAS's paths and FP8 scaled_mm natively, the
      # engine's logits and PEFT agreement over FP8 / AWQ / GPTQ checkpoints
      TRITON_INTERPRET=0 MULTILORA_TEST_DEVICE=cuda MULTILORA_TEST_TOKENIZER_DIR=$PWD/.device_pkg/tokenizer \
        timeout ${QUANT_TESTS_TIMEOUT:-300} python3 -m pytest -q -p no:cacheprovider ${QUANT_TESTS_K:+-k "$QUANT_TESTS_K"} \
        tests/kernels/test_quant_gemms.py tests/engine/test_quantized_base.py 2>&1 | tee "$OUT/quant-tests.log" | tail -25 ;;
    quant-bench)
      # FP8 / AWQ / GPTQ (quantized at load) against bf16 on the Llama-3-8B shape: single-stream and
      # batch-32 decode with 32 rank-16 adapters and the base alone, prefill, KL and top-1 against bf16
      timeout ${QUANT_BENCH_TIMEOUT:-560} python3 -m benchmarks.quant_gpu --rounds ${QUANT_ROUNDS:-2} ${QUANT_SECTIONS:+--sections $QUANT_SECTIONS} \
        ${QUANT_FORMATS:+--formats $QUANT_FORMATS} --json "$OUT/quant_gpu.json" 2>&1 \
        | tee "$OUT/quant-bench.log" | grep -v "^INFO" | tail -90 ;;
    quant-candidates)
      # weight-only 4-bit and FP8 GEMMs side by side on the 8B projections at every row count a step
      # sees (gemlite, dequantize + cuBLAS, tinygemm, FP8 scaled_mm) with bf16 beside them
      timeout ${QUANT_CANDIDATES_TIMEOUT:-420} python3 -m benchmarks.kernels.quant_candidates ${QUANT_ROWS:+--rows $QUANT_ROWS} \
        --json "$OUT/quant_candidates.json" 2>&1 | tee "$OUT/quant-candidates.log" | grep -v "^INFO" | tail -60 ;;
    swap-bench)
      # time-share swap of random:llama3-8b: its swap-in from page-locked host memory (Engine.unpark)
      # against a plain page-locked copy of the same bytes (target <= 2x), the first batch after a
      # swap-in, tokens equal after swaps; then a two-base pool's wait for the swapped-out base
      timeout ${SWAP_BENCH_TIMEOUT:-560} python3 -m benchmarks.swap_gpu --json "$OUT/swap_gpu.json" 2>&1 \
        | tee "$OUT/swap-bench.log" | grep -v "^INFO" | tail -45 ;;
    bench-queue-depth)
      # one adapter, 256 / 4,096 / 16,384 requests at once: the running batch's speed under a deep queue
      timeout 400 python3 -m multilora_studio bench --model random:llama3-8b --device cuda --dtype bfloat16 \
        --rank 16 --targets all --batch 32 --max-loras 32 --input-len 64 --output-len 32 \
        --sweep-adapters 1 --requests 256,4096,16384 --no-progress --json "$OUT/bench_queue_depth.json" 2>&1 \
        | tee "$OUT/bench-queue-depth.log" | grep -v " INFO " | tail -9 ;;
    bench-ranks)
      # Punica's patterns + base at batch 32 with rank-8 and rank-64 adapters on all projections
      for rank in 8 64; do
        timeout 200 python3 -m multilora_studio bench --model random:llama3-8b --device cuda --dtype bfloat16 \
          --rank $rank --targets all --batch 32 --max-loras 32 --input-len 64 --output-len 32 --pattern all \
          --no-progress --json "$OUT/bench_rank$rank.json" 2>&1 | tee "$OUT/bench-rank$rank.log" | grep -v " INFO " | tail -12
      done ;;
    bench-suite)
      # multilora-studio bench at the Llama-3-8B shape, rank 16 on all projections, 32 slots: Punica's
      # patterns + base at batch 32, S-LoRA's online workload at two rates (Zipf 1.0 over 128
      # adapters), throughput vs 1..1000 adapters under Zipf 1.0 (128 requests at once each)
      timeout 300 python3 -m multilora_studio bench --model random:llama3-8b --device cuda --dtype bfloat16 \
        --rank 16 --targets all --batch 32 --max-loras 32 --input-len 64 --output-len 32 --pattern all \
        --online --rate 16,48 --duration 5 --num-adapters 128 --alpha 1.0 \
        --sweep-adapters 1,8,32,128,1000 --requests 128 --no-progress --json "$OUT/bench_suite.json" 2>&1 \
        | tee "$OUT/bench-suite.log" | grep -v " INFO " | tail -20 ;;
    bench-peft)
      # the distinct pattern at batch 32 through the engine and through HF + PEFT (8 PEFT tokens)
      timeout 300 python3 -m multilora_studio bench --model random:llama3-8b --device cuda --dtype bfloat16 \
        --rank 16 --targets all --batch 32 --max-loras 32 --input-len 64 --output-len 32 --pattern distinct \
        --baseline peft --baseline-output-len 8 --no-progress --json "$OUT/bench_peft.json" 2>&1 \
        | tee "$OUT/bench-peft.log" | grep -v " INFO " | tail -10 ;;
    engine-fidelity)
      TRITON_INTERPRET=0 MULTILORA_TEST_DEVICE=cuda MULTILORA_TEST_TOKENIZER_DIR=$PWD/.device_pkg/tokenizer \
        timeout 300 python3 -m pytest -q -x -p no:cacheprovider --durations=5 tests/engine/test_fidelity.py \
        tests/engine/test_model_families.py tests/engine/test_kernel_warmup.py 2>&1 | tee "$OUT/engine-fidelity.log" | tail -14 ;;
    kernel-tests)
      # the LoRA kernel tests natively on the GPU (fused decode launch and add_lora vs float64)
      TRITON_INTERPRET=0 timeout 300 python3 -m pytest -q -x -p no:cacheprovider tests/kernels/test_lora_kernels.py \
        -k "${KERNEL_TESTS:-fused or add_lora_matches_reference or ranks_above}" 2>&1 | tee "$OUT/kernel-tests.log" | tail -5 ;;
    kernel-bench)
      OUT=$OUT timeout 420 python3 -m benchmarks.kernels.lora_bench --budget ${KERNEL_BUDGET:-240} \
        ${KERNEL_SECTIONS:+--sections $KERNEL_SECTIONS} 2>&1 | tee "$OUT/kernel-bench.log" | grep -v "^INFO" | tail -40 ;;
    attention-bench)
      timeout 240 python3 -m benchmarks.kernels.paged_attention_bench 2>&1 | tee "$OUT/attention-bench.log" | tail -30 ;;
  esac
  echo "=== $step took $(( $(date +%s) - start )) s"
done
