#!/bin/bash
# Prepared in session 20 (not run yet), one H200: where the ≈ 0.5 ms between a B = 1 decode step (2.2 ms for 8
# layers) and its graph replay (1.41) plus LM head (0.25) goes -- one captured step as a host / GPU timeline.
export PYTHONUNBUFFERED=1
timeout 150 python3 bench/profile_step.py --timeline --layers 8 --batch 1 --ctx 4096 2>&1 | grep -vE "Warning|warn|USDT" | tail -60
timeout 150 python3 bench/profile_step.py --timeline --layers 8 --batch 8 --ctx 4096 2>&1 | grep -vE "Warning|warn|USDT" | tail -40
