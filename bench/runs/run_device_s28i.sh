#!/bin/bash
# Session 28, one H200 (≈ 3 min): the ceilings, then in the same call (1) the wide MoE kernel from 9 pairs per
# expert (this session's default) against session 27's 16, M = 384-768; (2) an 8K prompt through 8 Flash layers
# in one forward vs in the engine's default token budget per step (2048: four forwards) and 4096 -- what the
# default budget costs a long prompt's TTFT.
source bench/runs/lib.sh
timeout 60 python3 -c "import sys; sys.path.insert(0,'.'); from bench.bench_gemm_moe import ceilings; \
print('ceilings', {k: round(v, 2) for k, v in ceilings().items()})"
timeout 100 python3 bench/bench_moe_flags.py --ms 384,512,640,768 "default:" \
  "from 16 per expert:dsv4.kernels.moe_config.WIDE64_MIN_PAIRS_PER_EXPERT=16" 2>&1 | tail -5
RANK=0 LOCAL_RANK=0 WORLD_SIZE=1 LOCAL_WORLD_SIZE=1 MASTER_ADDR=127.0.0.1 MASTER_PORT=29526 timeout 240 \
  python3 bench/bench_parallel.py --world 1 --layers 8 --reps 4 --batches 1 --ctx 4096 --kv-dtype fp8 \
  --prefill 8192 --prefill-chunks 8192,2048,4096 --prefill-reps 3 --cuda-graphs 2>&1 | grep -E "ceilings|prefill|rror"
