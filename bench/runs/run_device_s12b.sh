#!/bin/bash
# Session 12: the side-stream branches one by one (bit-identity test per branch; decode A/B per branch), the
# cuBLAS linear test after its fixes.
source bench/runs/lib.sh
export RANK=0 LOCAL_RANK=0 WORLD_SIZE=1 LOCAL_WORLD_SIZE=1 MASTER_ADDR=127.0.0.1 MASTER_PORT=29522
run 120 tests/gpu/test_model_gpu.py -k "side_stream"
grep -E "^E .*(diff|assert)" $OUT/pytest_120.txt | head -6
run 100 tests/gpu/test_fp8_linear.py -k "cublas or counters"
B="bench/bench_parallel.py --world 1 --layers 8 --reps 5 --batches 1,8 --ctx 8192 --kv-dtype fp8 --prefill 0 --cuda-graphs"
for o in "()" "('shared_expert',)" "('projections',)" "('shared_expert','projections')"; do
  echo "== OVERLAP=$o"
  timeout 100 python3 bench/flags.py "dsv4.model.side_stream.OVERLAP=$o" -- $B 2>&1 | grep -E "B=|Error|error"
done
