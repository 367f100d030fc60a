#!/bin/bash
# Session 83, one call (≈ 8 min), after run_device_s82e.sh on the same machine:
# (1) the decode mHC finish as "row" (one program per token collapses and normalises the whole row: no arrival
#     counter, no last-arriver pass) against the default "split" (8 collapse programs, the token's last arriver
#     normalises). "split" won at T = 1 in session 7, before the row finish issued the whole row's loads at once
#     (s36) and before the split's norm pass (s43); 8 Flash layers' B = 1 rows, alternating;
# (2) run_device_s82a.sh's Nsight diagnosis of the one-token MoE down / GLU and the one-row linears.
source bench/runs/lib.sh
nvidia-smi --query-gpu=name --format=csv,noheader
R="dsv4.kernels.mhc.COLLAPSE='row'"
rows8 150 1
rows8 100 1 $R
rows8 100 1
rows8 100 1 $R
bash bench/runs/run_device_s82a.sh
