#!/bin/bash
# Prepared in session 32 for session 33, one H200 (≈ 6 min). (1) GPU tests of session 32's last change: the
# indexer's prefill scores rows padded to 16 entries (indexer_scores.PAD_ROWS; poisoned padding must read -inf),
# the top-k that reads them, the model's prefill paths (PAD_ROWS stays off until this passes and the figure says
# on). (2) Its figure: the 8-layer prefill at 8,000 tokens (2,000 CSA entries: the 16-bit-store variant without
# padding) and at 8,192, PAD_ROWS off / on / off / on.
source bench/runs/lib.sh
python3 -c "import bench.bench_gemm_moe as b; print('ceilings', b.ceilings())" 2>&1 | tail -1
run 200 tests/gpu/test_indexer_scores.py tests/gpu/test_topk.py
run 150 tests/gpu/test_model_gpu.py -k "logits_match or greedy or fused_prefill"
# (session 32's review: three bit-for-bit MoE tests' setup moved into _skewed_moe, same seeds and draws; and
# `store_tile` loads the sorted ids once, in the layout each path uses -- not yet run on a GPU)
run 200 tests/gpu/test_moe_wide.py tests/gpu/test_requant.py
F=dsv4.kernels.indexer_scores.PAD_ROWS
export TRITON_CACHE_DIR=/tmp/tc_s33a  # (3) then: which kernels of these prompts still store 8 / 16 bits at a time
rm -rf $TRITON_CACHE_DIR
for N in 8000 8192; do
  for V in False True False True; do
    echo "prefill $N PAD_ROWS=$V"
    RANK=0 LOCAL_RANK=0 WORLD_SIZE=1 LOCAL_WORLD_SIZE=1 MASTER_ADDR=127.0.0.1 MASTER_PORT=29526 timeout 120 \
      python3 bench/flags.py "$F=$V" -- bench/bench_parallel.py --world 1 --layers 8 --reps 4 --batches 1 --ctx 4096 \
      --kv-dtype fp8 --prefill $N --cuda-graphs 2>&1 | grep -E "prefill|rror" | head -2
  done
done
python3 bench/ptx_cache_survey.py $TRITON_CACHE_DIR > $OUT/ptx_survey.txt
grep -E "st\.(b8|b16)" $OUT/ptx_survey.txt | head -12

