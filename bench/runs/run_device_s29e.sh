#!/bin/bash
# Session 29, one H200 (≈ 7 min): the prefill attention kernel's fused inverse RoPE (tests: bit-identical to the
# separate norm_rope launch, and model logits with attention.KERNEL_INVERSE_ROPE off / on); one 8K forward of 4
# Flash layers with it off / on (GPU time and wall); Python's profile of fresh 2048-token prompts ($OUT/cprofile.txt);
# the 8-layer 8K prefill row.
source bench/runs/lib.sh
run 150 tests/gpu/test_prefill_attention.py tests/gpu/test_model_gpu.py -k "prefill_attention or inverse or greedy"
for F in False True; do
  echo "KERNEL_INVERSE_ROPE=$F"
  timeout 100 python3 bench/flags.py dsv4.model.attention.KERNEL_INVERSE_ROPE=$F -- bench/profile_step.py --layers 4 \
    --prefill 8192 2>&1 | grep -E "wall|kernels,|Attention.finish|Attention.attend  "
done
TOP=40 timeout 100 python3 bench/profile_step.py --layers 4 --prefill 2048 --cprofile > $OUT/cprofile.txt 2>&1
grep -E "function calls|cProfile" $OUT/cprofile.txt
prefill8 150
