#!/bin/bash
# Session 9, call 4: the prefill indexer in two launches (dsv4.kernels.indexer_scores.prefill_index_scores +
# the radix top-k) -- GPU tests, its time against the torch path for an 8K prompt at Flash's indexer shape,
# and the end-to-end prefill 8K / decode of 8 Flash layers with it.
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/outs}; mkdir -p $OUT
run() {  # pytest with a time limit; prints the summary line and any failures
  timeout $1 python3 -m pytest -q -rf --tb=line -p no:cacheprovider "${@:2}" > $OUT/pytest_$1.txt 2>&1
  grep -E "passed|failed|FAILED|Error|error:" $OUT/pytest_$1.txt | grep -vE "^[.sF]+ *\[" | tail -14
}
run 100 tests/gpu/test_indexer_scores.py tests/gpu/test_topk.py
timeout 120 python3 - <<'PY'
import torch, triton
from dsv4.model.indexer import Indexer
t, h, di, n = 8192, 64, 128, 2048
g = torch.Generator("cuda").manual_seed(0)
q = torch.randn(t, h, di, device="cuda", generator=g).to(torch.bfloat16)
w = (torch.randn(t, h, device="cuda", generator=g) * (di * h) ** -0.5).to(torch.bfloat16)
keys = torch.randn(n, di, device="cuda", generator=g).to(torch.bfloat16)
pos = torch.arange(t, device="cuda")
ix = Indexer.__new__(Indexer); torch.nn.Module.__init__(ix); ix.topk, ix.ratio = 512, 4
res = {}
for mode in (False, True):
    ix.use_kernels = mode
    res[mode] = ix.select_indices(q, w, keys, pos)
    ms = triton.testing.do_bench(lambda: ix.select_indices(q, w, keys, pos), warmup=2, rep=20)
    print(f"select_indices T={t} N={n} Hi={h} kernels={mode}: {ms:.2f} ms")
big = torch.iinfo(torch.long).max
a, b = (torch.where(r < 0, big, r).sort(1).values for r in (res[False], res[True]))
print(f"rows with the same set: {(a == b).all(1).float().mean().item():.4f}")
from dsv4.kernels.indexer_scores import prefill_index_scores
vis = ((pos + 1) // 4).to(torch.int32)
ms = triton.testing.do_bench(lambda: prefill_index_scores(q, w, keys, vis), warmup=2, rep=20)
print(f"  of which scores: {ms:.2f} ms ({t * n * h * di * 2 / 2 / ms / 1e9:.0f} TFLOP/s on the visible half)")
PY
run 200 tests/gpu/test_model_gpu.py
timeout 150 python3 bench/bench_parallel.py --world 1 --layers 8 --reps 4 --cuda-graphs --batches 1,8 --kv-dtype fp8 \
    --prefill 8192 --json $OUT/step.json 2>&1 | grep -E "B=|prefill|copy"
