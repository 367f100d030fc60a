#!/bin/bash
# Session 82, the short form of run_device_s82a.sh for a call with little device time left: the per-kernel Nsight
# metrics only (DRAM share, issue activity, top stalls) of the one-token MoE GLU / finish / down / combine and the
# one-row attention linears.
RUN_S82A_METRICS_ONLY=1 bash bench/runs/run_device_s82a.sh
