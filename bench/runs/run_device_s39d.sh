#!/bin/bash
# Session 39: the CSA list tiles' entry indices loaded a tile ahead (prefill_attention_gluon.PREFETCH_IDX; s39c: the
# copies are 25 % of a CSA layer's attention, 12 % of HCA's, 2 % of SWA's -- only CSA loads indices before its
# copies). The Gluon attention tests, then per layer kind off / on / off / on at 8K.
source bench/runs/lib.sh
run 300 tests/gpu/test_prefill_attention_gluon.py tests/gpu/test_prefill_attention.py
for on in False True False True; do
  echo -n "PREFETCH_IDX=$on "
  timeout 60 python3 bench/flags.py dsv4.kernels.prefill_attention_gluon.PREFETCH_IDX=$on -- \
    bench/bench_prefill_glue.py --skip select queries --shapes gluon 2>&1 | tail -3 | tr '\n' ' '; echo
done
