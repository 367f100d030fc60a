#!/bin/bash
# Prepared in session 18 (not run yet), one H200: blocks of pairs where tokens share experts -- an MTP verify of
# 2 tokens at B = 1, and B = 2 / 4 / 8 -- with correlated routing (`--shared 0.5`: each pair of tokens shares
# about half its experts) and without, default vs one / two pairs per program. If two pairs win at 12-24 pairs
# with sharing and tie without, lower moe_config.GEMV_PAIRED_FROM (now 1.08 pairs per touched expert).
source bench/runs/lib.sh
timeout 120 python3 bench/sweep_moe_batch.py --tokens 2,4,8 --shared 0.5 2>&1 | grep -vE "Warning|warn"
timeout 100 python3 bench/sweep_moe_batch.py --tokens 2,4 2>&1 | grep -vE "Warning|warn"
