#!/bin/bash
# Prepared in session 62 (no device then; ≈ 4-5 min warm): the eager attention's derivations shared by the layers of
# a forward (dsv4.model.rope.SHARE_ACROSS_LAYERS: paged slot lists and device block tables, the compressors' entry
# positions and RoPE tables, the indexer's visible counts) off / on / off / on; 8 Flash layers, fresh prompts of 16
# and 128 tokens, eager and through the prefill pieces (whose host time is the eager attention's). CPU count
# (`bench/launch_inventory.py --prefill 16`, the tiny model's 4 layers): 279 -> 225 launches (330 with session 61's code).
source bench/runs/lib.sh
for share in False True False True; do
  echo "SHARE_ACROSS_LAYERS=$share"
  timeout 100 python3 bench/flags.py dsv4.model.rope.SHARE_ACROSS_LAYERS=$share -- bench/bench_prefill_graphs.py \
    --layers 8 --prompts 16,128 --reps 5 2>&1 | tail -3
done
