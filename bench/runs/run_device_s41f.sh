#!/bin/bash
# Session 41 (≈ 4 min): moe_bf16_ws after s41e (bit-identical on plain 128-row alignments; 6.77 vs 5.88 ms at 8K,
# Nsight 42.9 % tensor pipe against the default GLU's 58.5 %, mbarrier waits the top stall): the tests with mixed
# lists; the consumers releasing a half's slots after its own MMAs (WAIT_OWN), a 3-deep raw ring per producer.
source bench/runs/lib.sh
run 300 tests/gpu/test_moe_wide.py -k "bf16_ws"
F=dsv4.kernels.moe_wide
B=dsv4.kernels.moe_bf16_ws
timeout 300 python3 bench/bench_moe_flags.py --ms 4096,8192,16384 "default:" "ws:$F.WS_BF16_GLU=True" \
  "ws own:$F.WS_BF16_GLU=True,$B.WAIT_OWN=True" "ws own raw3:$F.WS_BF16_GLU=True,$B.WAIT_OWN=True,$B.RAW=3" \
  "ws raw3:$F.WS_BF16_GLU=True,$B.RAW=3" "ws own raw3 1p:$F.WS_BF16_GLU=True,$B.WAIT_OWN=True,$B.RAW=3,$B.PRODUCERS=1" \
  2>&1 | grep -vE "^\s*$|^  File|^    " | tail -5
M=$MMA_METRICS
KERNEL="_glu_bf16_ws" ncu_cmd 100 1 "$M" bench/flags.py $B.WAIT_OWN=True $B.RAW=3 -- bench/bench_moe_flags.py \
  --ms 8192 "ws:$F.WS_BF16_GLU=True"
