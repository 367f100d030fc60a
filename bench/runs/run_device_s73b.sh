# Session 73: with the fold's bit test and PREFILL_FP8 on, the indexer-score and top-k GPU tests, then the FP8 scores
# end to end at 16K, 8K and 4K keys
source bench/runs/lib.sh
runpar 200 4 tests/gpu/test_indexer_scores.py tests/gpu/test_topk.py
for p in 57344 24576 8192; do timeout 45 python3 bench/sweep_index_scores.py --fp4 --prefix $p --shapes 2>&1 | grep -E "keys|default \||gluon|fp8"; done
