#!/bin/bash
# Session 47 (≈ 6 min): the persistent Gluon decode GLU (dsv4.kernels.moe_glu_decode, opt-in): its GPU tests, the
# Flash MoE call at 1, 2, 4 tokens (CUDA graphs of 16 routings) with it off / on and at other splits / ring depths,
# then 8-layer B = 1 rows alternating off / on.
source bench/runs/lib.sh
timeout 240 python3 -m pytest -q -s -rf --tb=short -p no:cacheprovider tests/gpu/test_moe_glu_decode.py > $OUT/glu.txt 2>&1
grep -E "bit-identical|passed|failed|Error|error" $OUT/glu.txt | head -20
G=dsv4.kernels.moe_glu_decode
# (the timings only after a clean test run: a hung or wrong kernel would only waste the device time)
grep -qE "^[0-9]+ passed in" $OUT/glu.txt || { tail -30 $OUT/glu.txt; exit 1; }
timeout 240 python3 bench/bench_moe_flags.py --ms 1,2,4 --graphs 16 "triton:" "gluon:$G.ENABLED=True" \
  "gluon 2c:$G.ENABLED=True,$G.CONSUMERS=2" \
  "triton again:" 2>&1 | tail -12
rows8 90 1 "$G.ENABLED=True"
rows8 90 1
