#!/bin/bash
# Session 54 (≈ 8 min): session 53's prepared GPU tests first (the RoPE angles' cast folded into the multiply, the
# engine's retention / prompt-logprob / prompt-sharing tests), then the opt-in branch rows of run_device_s53a.sh
# once each (defaults twice), then run_device_s54b.sh.
source bench/runs/lib.sh
export PYTHONPATH=$PWD
runpar 330 8 tests/gpu/test_decode_step_fusions.py tests/gpu/test_model_gpu.py tests/gpu/test_norm_rope.py \
  tests/gpu/test_engine_gpu.py tests/gpu/test_sampler_gpu.py
I=dsv4.model.attention.INDEXER_BESIDE=True
S=dsv4.model.block.STEP_TABLES_BESIDE=True
P2="dsv4.model.side_stream.PRIORITY={2:-1,3:-1}"
for f in "" "$I" "$S" "$I $S $P2" ""; do
  echo "== ${f:-defaults}"; rows8 60 1 $f | grep -E "replay|copy" | sed -E 's/MTP draft.*//'
done
