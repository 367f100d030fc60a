#!/bin/bash
# Prepared in session 29 for session 30, one H200 (≈ 5 min); then run_device_s30b.sh.
# (1) compressor.FUSED_POOL, attention.FUSED_PREFILL_READS and PREFILL_HCA_CAUSAL (prepared, interpreter-tested
#     only: `cache_store.pool_chunk`, `load_rows`, `prefill_attention(causal_ratio=)`): their GPU tests, then one 8K forward of 4 Flash layers with them off /
#     on (wall, kernels, GPU time). If the tests pass and they are not slower, make them the defaults, note figures.
# (2) is an eager 8K / 2K forward bound by the host or by the GPU, and where? (s29e: the inverse RoPE fused into the
#     prefill attention took 1.43 ms of GPU time off an 8K forward of 4 layers, 52.6 -> 51.1 ms, but its wall time
#     stayed at 55.4 ms; no host syncs in it, s29f). Per kernel the host's lead (GPU start minus launch end) and the
#     GPU idle before kernels that waited, by the part that launched them.
source bench/runs/lib.sh
python3 -c "import bench.bench_gemm_moe as b; print('ceilings', b.ceilings())" 2>&1 | tail -1  # this call's
run 150 tests/gpu/test_cache_store.py tests/gpu/test_model_gpu.py tests/gpu/test_prefill_attention.py \
  -k "load_rows or pool_chunk or prefill_chunk or fused_prefill or causal"
C=dsv4.model.compressor.FUSED_POOL
R=dsv4.model.attention.FUSED_PREFILL_READS
H=dsv4.model.attention.PREFILL_HCA_CAUSAL
for V in "$C=False" "$C=True" "$C=True $R=True $H=True"; do
  echo "$V"
  timeout 70 python3 bench/flags.py $V -- bench/profile_step.py --layers 4 --prefill 8192 2>&1 | grep -E "wall|kernels,"
done
for N in 8192 2048; do
  timeout 90 python3 bench/profile_step.py --layers 4 --prefill $N --timeline 2>&1 | grep -vE "Warn|warn" | tail -16
done
