#!/bin/bash
# Session 11: eager decode at ctx 8192 took 22.9 ms per step for 8 layers in s11c, with ~2.3 ms of GPU time
# (profile): where the host's time goes (cProfile), and whether the captured step has it too.
source "$(dirname "$0")/lib.sh"
timeout 120 python3 bench/profile_step.py --layers 4 --ctx 8192 --cprofile 2>&1 | grep -v "^ *$" | head -75
timeout 100 python3 bench/profile_step.py --layers 4 --ctx 8192 --host 2>&1 | head -30
timeout 60 python3 bench/profile_step.py --layers 4 --ctx 1024 --cprofile 2>&1 | head -3
