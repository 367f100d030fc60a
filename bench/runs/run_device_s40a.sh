#!/bin/bash
# Prepared in session 39 for session 40, one H200 (≈ 4 min): prefill_attention_scorer.EARLY_QK (the next tile's QK
# issued right behind this tile's P.V, waited for together; offline 255 registers, no spill, no ptxas
# serialisation note) -- the Gluon attention tests with every kernel (the scorer's default path was refactored into
# `_qk` / `_softmax_pv` after its s39f measurement: offline SASS differs only in one block's register allocation),
# then per layer kind at 8K with ONE_SCORER on every call: EARLY_QK off / on / off / on. If CSA wins, make it the
# default; the copies may be more exposed (the slot frees after the next QK is issued), so check CSA and HCA.
source bench/runs/lib.sh
run 330 tests/gpu/test_prefill_attention_gluon.py
G=dsv4.kernels.prefill_attention_gluon
S=dsv4.kernels.prefill_attention_scorer
for on in False True False True; do
  echo -n "EARLY_QK=$on "
  timeout 60 python3 bench/flags.py $G.ONE_SCORER=True $S.EARLY_QK=$on -- \
    bench/bench_prefill_glue.py --skip select queries --shapes gluon 2>&1 | tail -3 | tr '\n' ' '; echo
done
