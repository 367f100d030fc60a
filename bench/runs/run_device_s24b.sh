#!/bin/bash
# Prepared in session 23, one H200: the one-row GEMV configs were picked (session 17) with every launch prefetching
# its weight before the PDL wait; since session 23 only weights <= 2 MiB do. Re-sweep the Flash shapes under the new
# policy (does `pick_gemv_config` still pick the best?), then the 8-layer rows for reference.
source bench/runs/lib.sh
timeout 260 python3 bench/sweep_gemv.py --models flash 2>&1 | grep -E "^flash|copy|rror" | cut -c1-190
rows8 100 1,8
