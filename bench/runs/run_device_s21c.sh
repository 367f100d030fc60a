#!/bin/bash
# Session 21, one H200: decode through the engine (LLMEngine.step) against the model's graph replay, 8 Flash
# layers, B = 1 / 8 / 64 at a 4096-token prompt, host-computed slots on (the new default) and off; then the B = 8
# step timeline (profile_step's pools now hold every sequence at full length).
export PYTHONUNBUFFERED=1
timeout 200 python3 bench/bench_engine_step.py --layers 8 --batches 1,8,64 --prompt 4096 --steps 32 --top 30 2>&1 \
  | grep -vE "Warning|warn"
echo "DSV4_HOST_SLOTS=0:"
DSV4_HOST_SLOTS=0 timeout 150 python3 bench/bench_engine_step.py --layers 8 --batches 1,8 --prompt 4096 --steps 32 \
  --top 0 2>&1 | grep -E "^[0-9B] "
timeout 120 python3 bench/profile_step.py --timeline --layers 8 --batch 8 --ctx 4096 2>&1 | grep -vE "Warning|warn|USDT" | tail -40
