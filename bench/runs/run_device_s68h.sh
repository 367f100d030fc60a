#!/bin/bash
# Session 68 (≈ 4 min, the budget's last). The decode indexer's scores kernel rounds with the packed conversion too
# (indexer_scores.PACKED_RELU): 8 Flash layers' graph replay at B = 1 and 8 with it on (default) and off.
source bench/runs/lib.sh
nvidia-smi --query-gpu=name --format=csv,noheader
for s in "" "dsv4.kernels.indexer_scores.PACKED_RELU=False"; do echo "flags: ${s:-default}"; rows8 100 1,8 $s; done
