#!/bin/bash
# Prepared in session 29 for session 30, one H200 (≈ 6 min), after run_device_s30a.sh; then s30c.sh.
# (Ran in session 30: LAZY_RESCALE measured slower and removed; UNMASKED_LOADS made the default. Not rerunnable as is.)
source bench/runs/lib.sh
python3 -c "import bench.bench_gemm_moe as b; print('ceilings', b.ceilings())" 2>&1 | tail -1  # this call's
# (1) the prefill attention's prepared variants (prefill_attention.LAZY_RESCALE, UNMASKED_LOADS; interpreter-tested,
#     compiled offline: the entries loop 1,393 -> 1,265 instructions per 64-key tile unmasked, the rescale's 128
#     multiplies per tile skipped while the maximum holds), ms per layer kind at 8K, 64- and 32-key tiles; then
#     their GPU tests. Keep what wins (module defaults), note the figures.
run 120 tests/gpu/test_prefill_attention.py
P=dsv4.kernels.prefill_attention
for V in "$P.KV_ONE_LOAD=True" "$P.LAZY_RESCALE=True" "$P.UNMASKED_LOADS=True" "$P.LAZY_RESCALE=True $P.UNMASKED_LOADS=True"; do
  echo "$V"
  timeout 60 python3 bench/flags.py $V -- bench/bench_prefill_glue.py --skip select queries --kv-one-load \
    --shapes 512,64,8,2 512,32,8,2 2>&1 | tail -4
done
# (2) who calls the prefill's many small torch ops (fresh 2048-token prompts of 4 layers; $OUT/callers_2048.txt)
CALLERS="method 'to',method 'float',built-in method torch.empty,built-in method torch.where" TOP=10 timeout 90 \
  python3 bench/profile_step.py --layers 4 --prefill 2048 --cprofile > $OUT/callers_2048.txt 2>&1
grep -c "" $OUT/callers_2048.txt
