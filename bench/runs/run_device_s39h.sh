#!/bin/bash
# Session 39: the 4-layer 8K profile's kernel table on the final defaults (PREFETCH_IDX, ONE_SCORER="lists").
source bench/runs/lib.sh
ktab 120 "_attn_kernel|_scorer_kernel|_wide_async|_glu_fp8|_mix_kernel"
