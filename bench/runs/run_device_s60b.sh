#!/bin/bash
# Session 60: how host-bound is a short prompt's prefill? 8 Flash layers, one fresh prompt per forward: wall vs GPU
# time at 128 / 512 / 2048 tokens, then cProfile of 512-token prefills (own time, top 45).
export PYTHONPATH=$PWD
for n in 128 512 2048; do
  timeout 150 python3 bench/profile_step.py --layers 8 --prefill $n 2>&1 | grep -E "chunk after|kernels,"
done
TOP=45 timeout 150 python3 bench/profile_step.py --layers 8 --prefill 512 --cprofile 2>&1 | \
  grep -v "^$" | sed -n '1,60p'
