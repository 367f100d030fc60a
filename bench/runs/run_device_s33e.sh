#!/bin/bash
# Session 33, one H200 (≈ 5 min). (1) Which decode MoE stage gives other bits with moe_gemv.SCALE_WORDS at Flash
# shapes (s33c/s33d: 0.01-0.08 % of the call's outputs differ at M = 4..64; interpreter and small GPU tests equal).
# (2) indexer_scores.PAD_ROWS where it matters: 8,004 tokens (2,001 entries, not divisible by 16; s33a's 8,000 /
# 8,192 both were). (3) The decode MoE in CUDA graphs (sweep_moe_gemv's timing), bytes / words, M = 1 and 8.
source bench/runs/lib.sh
python3 -c "import bench.bench_gemm_moe as b; print('ceilings', b.ceilings())" 2>&1 | tail -1
timeout 150 python3 bench/probe_scale_words.py 2>&1 | tail -20
F=dsv4.kernels.indexer_scores.PAD_ROWS
for V in False True False True; do
  echo "prefill 8004 PAD_ROWS=$V"
  RANK=0 LOCAL_RANK=0 WORLD_SIZE=1 LOCAL_WORLD_SIZE=1 MASTER_ADDR=127.0.0.1 MASTER_PORT=29526 timeout 120 \
    python3 bench/flags.py "$F=$V" -- bench/bench_parallel.py --world 1 --layers 8 --reps 4 --batches 1 --ctx 4096 \
    --kv-dtype fp8 --prefill 8004 --cuda-graphs 2>&1 | grep -E "prefill|rror" | head -2
done
G=dsv4.kernels.moe_gemv.SCALE_WORDS
for T in 1 8; do
  for V in False True False True; do
    echo "tokens $T SCALE_WORDS=$V"
    timeout 60 python3 bench/flags.py "$G=$V" -- bench/sweep_moe_gemv.py --tokens $T --default-only 2>&1 | tail -1
  done
done
