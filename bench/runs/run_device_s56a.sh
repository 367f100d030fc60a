#!/bin/bash
# Prepared in session 55 for session 56 (≈ 6 min with the start): run_device_s55c.sh again -- the structured-output
# GPU test, then bench_structured.py with the apply in fewer launches (host and kernel time apart, at 129,280 tokens
# from the installed packages' sources) -- then the 8-layer B = 1 row as the session's baseline. Carry [".whl"].
bash bench/runs/run_device_s55c.sh
source bench/runs/lib.sh
export PYTHONPATH=$PWD
rows8 100 1 | sed -E 's/MTP draft.*//'
