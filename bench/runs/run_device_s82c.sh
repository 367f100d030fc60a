#!/bin/bash
# Session 82, one call on an H200 (≈ 8 min, most useful first; a cut run keeps what it printed):
# (1) run_device_s82a.sh's Nsight diagnosis of the one-token MoE down / GLU and the one-row attention linears;
# (2) targets.sh less its 8-layer decode rows (measured by run_device_s82b.sh in this session): the 8K prefill of 8
#     Flash layers, the Flash MoE call at M = 1 / 2 / 4 in graphs, the MoE at 4096 / 8192 tokens, the linears.
source bench/runs/lib.sh
bash bench/runs/run_device_s82a.sh
NO_ROWS=1 bash bench/runs/targets.sh
