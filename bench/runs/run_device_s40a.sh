#!/bin/bash
# Prepared in session 39 for session 40, one H200 (≈ 6 min): two prepared variants of the scorer prefill attention
# (offline: 255 registers, no spill, no ptxas serialisation note; the default path's SASS unchanged by both):
#   EARLY_QK    the next tile's QK issued right behind this tile's P.V, P.V(i) waited for with one group outstanding
#               (the slot's release then also waits for the next tile's landing);
#   SPLIT_LAND  each tile's two column halves land on their own mbarriers; QK starts on the first half.
# The Gluon attention tests with every kernel (pair, scorer, scorer_early, scorer_split), then per layer kind at 8K
# with ONE_SCORER on every call: default / early / split / both / default. Adopt what wins on CSA (and check HCA /
# SWA: if the scorer then wins there too, ONE_SCORER=True for every layer).
source bench/runs/lib.sh
run 330 tests/gpu/test_prefill_attention_gluon.py
G=dsv4.kernels.prefill_attention_gluon
S=dsv4.kernels.prefill_attention_scorer
for cfg in "False False" "True False" "False True" "True True" "False False"; do
  read early split <<< "$cfg"
  echo -n "EARLY_QK=$early SPLIT_LAND=$split "
  timeout 50 python3 bench/flags.py $G.ONE_SCORER=True $S.EARLY_QK=$early $S.SPLIT_LAND=$split -- \
    bench/bench_prefill_glue.py --skip select queries --shapes gluon 2>&1 | tail -3 | tr '\n' ' '; echo
done
