#!/bin/bash
# Session 50: run-to-run differences of the tiny model's paged decode (diag_race.py) per side-stream setting.
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
timeout 330 python3 bench/runs/diag_race.py old=4 old-noside=4 new=4 new-noside=4 old-proj=3 old-shared=3 2>&1 \
  | grep -vE "Warning|warn" | tail -24
