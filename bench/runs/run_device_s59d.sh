#!/bin/bash
# Session 59: the memory the decode graphs hold (now the default on one GPU), per row bucket; 8 layers at a
# 1K-context bucket, then 4 layers at a 4K-context bucket (the pools should not grow with the layers).
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
timeout 200 python3 bench/bench_graph_memory.py --layers 8 --max-batch 32 --prompt 256 2>&1 | grep -vE "Warning|warn"
timeout 110 python3 bench/bench_graph_memory.py --layers 4 --max-batch 8 --prompt 3000 2>&1 | grep -vE "Warning|warn"
