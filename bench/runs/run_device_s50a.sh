#!/bin/bash
# Prepared in session 49 for session 50 (≈ 4 min with a warm machine; its first two parts ran in session 49: tests
# pass, the call -4 % at M = 1, +1 % at 2 and 4): Pro's down on the persistent kernel
# (moe_glu_decode.DOWN_ODD_SPLIT: its inter 3072 in 3 K ranges of 8 blocks; one range of 24 does not compile, the
# activation tiles' shape needs a power of two). Never run: its GPU tests first (inter 1536 -> 3 ranges of 4), then
# Pro's MoE call off / on, then 4 Pro layers' rows off / on. Adopt it if the tests pass and both win.
source bench/runs/lib.sh
G=dsv4.kernels.moe_glu_decode
gate 150 tests/gpu/test_moe_glu_decode.py || exit 1
timeout 200 python3 bench/bench_moe_flags.py --experts pro --ms 1,2,4 --graphs 16 "default:" \
  "down odd split:$G.DOWN_ODD_SPLIT=True" "default again:" "down odd split again:$G.DOWN_ODD_SPLIT=True" 2>&1 | tail -4
for f in False True False True; do
  echo "== DOWN_ODD_SPLIT=$f"; pro 150 1,2 4096 0 $G.DOWN_ODD_SPLIT=$f | grep -E "ceil|replay"
done
