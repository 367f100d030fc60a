#!/bin/bash
# Session 36 (≈ 1 min, run on the warm s36c machine): the 8-layer 8K prefill with the new prefill mHC finish
# (COLLAPSE_PREFILL = "row", the default) and with the split finish it replaced.
source bench/runs/lib.sh
prefill8 90
prefill8 90 "dsv4.kernels.mhc.COLLAPSE_PREFILL='split'"
