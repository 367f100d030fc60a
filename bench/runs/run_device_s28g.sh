#!/bin/bash
# Runs on commit f564861 (its kernels and bench options were measured and reverted in the commit after it).
# Session 28, one H200 (≈ 5 min): the register path's ring as separate allocations with static slots (one CTA
# barrier per 64-wide half instead of three; GLU loop 610 -> 522 instructions per K block, down 358 -> 276) and
# each slot refilled after the next half's barrier. The MoE GPU tests, then an A/B of the GEMMs against the
# session-27 kernels (bench/runs/old_moe_wide_async.py, a copy of them kept for this A/B) in one call.
source bench/runs/lib.sh
run 220 tests/gpu/test_moe_wide.py
for mod in bench.runs.old_moe_wide_async dsv4.kernels.moe_wide_async; do
  echo "--- $mod"
  timeout 100 python3 bench/bench_moe_wide_shapes.py --module $mod --ms 4096,8192,16384 --shapes 64,4,reg,4 \
    128,8,reg,4 128,8,smem,4 2>&1 | tail -9
done
timeout 60 python3 bench/bench_moe_wide_shapes.py --ms 8192 --shapes 64,4,reg,6 128,8,reg,6 2>&1 | tail -2
C=dsv4.kernels.moe_wide
timeout 100 python3 bench/bench_moe_flags.py --ms 2048,4096,8192,16384 "default:" "down reg:$C.ASYNC_A_SMEM=False" \
  2>&1 | tail -5
