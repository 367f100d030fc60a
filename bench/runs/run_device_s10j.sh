#!/bin/bash
# Session 10, last call (run inline): the attention / indexer / top-k / cache GPU tests on the final tree.
source "$(dirname "$0")/lib.sh"
run 150 tests/gpu/test_attention.py tests/gpu/test_indexer_scores.py tests/gpu/test_topk.py tests/gpu/test_cache_store.py
