#!/bin/bash
# Session 73: the indexer's FP8 scores (the fold's bit test) and the sampled top-k from 8K entries, on by default:
# their GPU tests, then an 8K chunk of 4 Flash layers (SWA, SWA, CSA, HCA) after 248K and 56K tokens, with the new
# settings and then with session 72's (FP8 off, sampled from 32K). Ran in session 74 (s74a, H200).
source bench/runs/lib.sh
nvidia-smi --query-gpu=name --format=csv,noheader
runpar 200 4 tests/gpu/test_indexer_scores.py tests/gpu/test_topk.py
OLD="dsv4.kernels.indexer_scores.PREFILL_FP8=False dsv4.kernels.topk.SAMPLED_MIN_N=32768"
for prefix in 253952 57344; do
  for flags in "" "$OLD"; do
    echo "== prefix $prefix flags: ${flags:-new defaults}"
    timeout 200 python3 bench/flags.py $flags -- bench/profile_step.py --layers 4 --prefill 8192 --prefix $prefix 2>&1 \
      | grep -E "chunk after|kernels, |^layer |_scores|_topk|rror" | head -14
  done
done
# session 74: the ceilings of this call and one 8K prompt of 8 Flash layers (the first chunk: 2K indexer keys)
python3 -c "import sys; sys.path.insert(0, 'bench'); from bench_engine_step import _ceilings; _ceilings(True)" 2>&1 \
  | grep ceilings
prefill8 200
# the first 8K chunk (no prefix): where its GPU time goes now
timeout 200 python3 bench/profile_step.py --layers 4 --prefill 8192 2>&1 | grep -vi warn | head -60
