"""Host side of the producer-warp chain prototype (bench/producer_chain.py; the kernel runs on the GPU through
bench/bench_producer_chain.py): its work split against a brute-force search, the barrier's PTX with a named CTA
barrier, and an sm_90a compile of the kernel on the CPU (no spills; the consumers' named barrier 15 is used by
nothing else in the kernel; the weights arrive by TMA)."""

from __future__ import annotations

import inspect
import os
import random
import re
import subprocess
import tempfile

import pytest

from bench.producer_chain import BK, chain_shape
from dsv4.kernels.grid_barrier import arrive_and_wait_asm


def _brute_shape(d: int, programs: int, bn: int):
    tiles, kb = d // bn, d // BK
    options = [s for s in range(1, kb + 1) if s in (1, 2, 4, 8, 16, 32) and kb % s == 0
               and (kb // s) in (1, 2, 4, 8, 16, 32, 64) and (tiles * s) % programs == 0]
    return (options[0], tiles * options[0] // programs) if options else None


@pytest.mark.parametrize("seed", range(3))
def test_chain_shape_is_the_smallest_even_split(seed):
    rng = random.Random(seed)
    for _ in range(300):
        d, programs, bn = BK * rng.randint(1, 64), rng.choice([32, 64, 96, 128, 132]), rng.choice([32, 64])
        want = _brute_shape(d, programs, bn)
        if want is None:
            with pytest.raises(ValueError, match="do not split evenly"):
                chain_shape(d, programs, bn)
        else:
            split, per = chain_shape(d, programs, bn)
            assert (split, per) == want and (d // bn) * split == per * programs


def test_barrier_asm_holds_the_given_cta_barrier_around_one_arrival():
    for cta in ("bar.sync 0", "bar.sync 15, 128"):
        asm = arrive_and_wait_asm(cta)
        lines = [ln.strip() for ln in asm.splitlines()]
        assert lines.count(cta + ";") == 2 and lines.index(cta + ";") < lines.index("DONE:") < \
            len(lines) - 1 - lines[::-1].index(cta + ";")
        assert asm.count("atom.release.gpu") == 1 and asm.count("ld.acquire.gpu") == 1
    assert "bar.sync 0" not in arrive_and_wait_asm("bar.sync 15, 128")


def test_producer_chain_compiles_for_sm90a():
    triton = pytest.importorskip("triton")
    pytest.importorskip("triton.experimental.gluon")
    import triton.backends.nvidia as nv
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    import bench.producer_chain as pc
    ptxas = os.path.join(os.path.dirname(nv.__file__), "bin", "ptxas")
    if not hasattr(pc, "producer_chain_kernel") or not os.path.exists(ptxas):
        pytest.skip("needs triton's Gluon and its bundled ptxas")
    bn = 64
    desc = (f"tensordesc<fp8e4nv[{bn}, 128],NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=8, rank=2, "
            "transposed=False, fp4_padded=False, cga_layout=[])>")
    sig = {"X": "*bf16", "w_desc": desc, "SW": "*fp32", "P": "*fp32", "Y": "*bf16", "CNT": "*i64", "S": "i32",
           "D": "i32", "PER": "i32", "SPLIT": "constexpr", "BN": "constexpr", "KB_PER": "constexpr", "R": "constexpr",
           "num_warps": "constexpr"}
    names = list(inspect.signature(pc.producer_chain_kernel.fn).parameters)
    assert set(names) == set(sig)
    attrs = {(j,): [["tt.divisibility", 16]] for j, n in enumerate(names) if sig[n].startswith("*") or n == "D"}
    k = triton.compile(GluonASTSource(fn=pc.producer_chain_kernel, signature=sig,
                                      constexprs={"SPLIT": 2, "BN": bn, "KB_PER": 16, "R": 16, "num_warps": 4}, attrs=attrs),
                       target=GPUTarget("cuda", 90, 32), options={"num_warps": 4})
    ptx = k.asm["ptx"]
    with tempfile.TemporaryDirectory() as tmp:
        src, out = os.path.join(tmp, "k.ptx"), os.path.join(tmp, "k.cubin")
        with open(src, "w") as f:
            f.write(ptx)
        info = subprocess.run([ptxas, "-arch=sm_90a", "-v", src, "-o", out], capture_output=True, text=True)
    assert info.returncode == 0, info.stderr[-2000:]
    assert re.search(r"\b0 bytes spill stores", info.stderr)
    # the consumers' grid barrier: named barrier 15 before and after each of its two call sites, nothing else on it
    assert len(re.findall(r"bar(?:rier)?\.sync(?:\.aligned)?\s+15\b", ptx)) == 4
    assert "cp.async.bulk.tensor.2d" in ptx and "mbarrier.try_wait" in ptx
    assert k.metadata.shared >= 16 * bn * 128  # the ring of 16 weight tiles
