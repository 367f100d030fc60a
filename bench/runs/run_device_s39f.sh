#!/bin/bash
# Session 39: the one-scorer prefill attention (prefill_attention_scorer, ONE_SCORER: one warp-specialized warpgroup
# scores every tile with N = 64, both multiply; the copies on the multiplier's warps). Its Gluon tests (every test
# with both kernels), then per layer kind at 8K: pair / scorer, and the scorer with PROBE_NO_COPY.
source bench/runs/lib.sh
run 300 tests/gpu/test_prefill_attention_gluon.py -k scorer
G=dsv4.kernels.prefill_attention_gluon
for cfg in "False False" "True False" "True True"; do
  read on probe <<< "$cfg"
  echo -n "ONE_SCORER=$on PROBE_NO_COPY=$probe "
  timeout 60 python3 bench/flags.py $G.ONE_SCORER=$on $G.PROBE_NO_COPY=$probe -- \
    bench/bench_prefill_glue.py --skip select queries --shapes gluon 2>&1 | tail -3 | tr '\n' ' '; echo
done
