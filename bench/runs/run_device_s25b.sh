#!/bin/bash
# Prepared in session 24, one H200: the producer-warp persistent chain (bench/producer_chain.py, Gluon: a TMA warp
# streams every stage's weights into a 16-slot shared-memory ring ahead of the consumers, who meet at a grid barrier
# on a named CTA barrier). First its correctness at 1 and 2 chain stages (an error of 0.1 or more from the second
# stage on is a hand-off race), then the 8-stage timing against the launches and the bytes at copy bandwidth. The
# decision for #6: if it is near bytes@copy + ~1-2 µs per stage at 4.2-16.8 MB, build the attention-input sub-layer
# this way. Time limits throughout: a deadlocked kernel must not eat the call.
source bench/runs/lib.sh
for s in 1 2; do
  timeout 90 python3 bench/bench_producer_chain.py --dims 1024,2048,4096 --stages $s 2>&1 | grep -E "^[0-9]|rror" | head -4
done
timeout 120 python3 bench/bench_producer_chain.py --dims 1024,2048,4096 --stages 8 2>&1 | tee $OUT/producer.txt | tail -5
timeout 90 python3 bench/bench_producer_chain.py --dims 2048,4096 --stages 8 --ring 8 2>&1 | grep -E "^[0-9]|rror"
