#!/bin/bash
# Session 28, one H200 (≈ 1.5 min): the host side of eager 2048-token prefill forwards of 4 Flash layers (s28j: 45.5 ms
# of wall time for 17.8 ms of GPU time): CPU time by torch op and by model part.
source bench/runs/lib.sh
TOP=45 timeout 150 python3 bench/profile_step.py --layers 4 --prefill 2048 --prefix 6144 --host --eager 2>&1 | tail -50
