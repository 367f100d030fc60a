source bench/runs/lib.sh
runpar 200 4 tests/gpu/test_indexer_scores.py tests/gpu/test_topk.py
for p in 57344 24576 8192; do timeout 45 python3 bench/sweep_index_scores.py --fp4 --prefix $p --shapes 2>&1 | grep -E "keys|default \||gluon|fp8"; done
