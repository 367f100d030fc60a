#!/bin/bash
# Session 12: an 8K prefill's kernels in launch order with the part that launched each (side stream off, so the
# launches pair up with one stream's GPU events); the listing is saved under $OUT.
source bench/runs/lib.sh
timeout 150 python3 bench/flags.py "dsv4.model.side_stream.OVERLAP=()" -- bench/profile_step.py --layers 4 \
    --prefill 8192 --order > $OUT/prof_prefill_order.txt 2>&1; head -5 $OUT/prof_prefill_order.txt; wc -l $OUT/prof_prefill_order.txt
