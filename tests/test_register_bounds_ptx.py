"""Launches under register bounds, compiled offline for sm_90a (no GPU: `bench/sass_stats.py`'s cases): the
persistent decode MoE kernels under `moe_glu_decode.GLU_BOUND` / `DOWN_BOUND` (session 84; the defaults since session
85), the down finishing z itself (FINISH_IN_DOWN, session 85) and the one-token GEMV under its opt-in cap
(`linear_config.GEMV_MAXNREG`). ptxas must neither spill nor serialise the wgmmas at the pairs the module's comment
recommends (it does at neighbouring ones: the GLU at (152, 168) spills 40 B, at (128, 136) its wgmmas are
serialised), and the launch keeps the bound."""

from __future__ import annotations

import os
import re
import sys

import pytest

triton = pytest.importorskip("triton")
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))


@pytest.mark.parametrize("case,maxnreg", [("moe_down_decode_b160", 160), ("moe_down_decode_b128", 128),
                                          ("moe_glu_decode_b136", 136), ("moe_down_decode_fin", 128),
                                          ("fp8_gemv_wq_a_r104", 104)])
def test_bounded_persistent_kernels_compile_clean(case, maxnreg):
    from bench.sass_stats import OPTIONS, compile_kernel, ptxas_report

    assert OPTIONS[case] == {"maxnreg": maxnreg}
    try:
        k, _, _ = compile_kernel(case)
        info, _ = ptxas_report(k)
    except (ImportError, RuntimeError, FileNotFoundError) as err:  # a triton without its NVIDIA backend / ptxas
        pytest.skip(f"cannot compile {case} for sm_90a here: {err}")
    assert f".maxnreg {maxnreg}" in k.asm["ptx"], case
    assert re.search(r"Used (\d+) registers", info).group(1) == str(maxnreg), info
    assert re.search(r"\b0 bytes spill stores", info), info
    assert not re.search(r"C751\d", info), f"{case}: ptxas serialises the wgmmas:\n{info}"


def test_register_bound_pairs_are_checked(monkeypatch):
    """`_register_bound`: a set bound passes its maxnreg and the second consumer's registers (the defaults since
    session 85: the GLU (136, 184), the down (128, 136)); None passes Triton's bound and CONSUMER_REGS; a pair that
    leaves the first consumer (3 x maxnreg - second - 40) fewer registers than the second, or a maxnreg off the
    8-register grain, is refused before any launch."""
    from dsv4.kernels import moe_glu_decode as mg

    monkeypatch.setattr(mg, "CONSUMERS", 2)
    assert mg._register_bound(True) == {"maxnreg": mg.GLU_BOUND[0], "REGS": mg.GLU_BOUND[1]}
    monkeypatch.setattr(mg, "DOWN_BOUND", None)
    assert mg._register_bound(False) == {"REGS": mg.CONSUMER_REGS}
    monkeypatch.setattr(mg, "GLU_BOUND", None)
    monkeypatch.setattr(mg, "DOWN_BOUND", (160, 200))
    assert mg._register_bound(False) == {"maxnreg": 160, "REGS": 200}
    assert mg._register_bound(True) == {"REGS": mg.CONSUMER_REGS}  # the GLU keeps its own (None)
    for bad in ((128, 200), (130, 136)):
        monkeypatch.setattr(mg, "GLU_BOUND", bad)
        with pytest.raises(ValueError, match="register bound"):
            mg._register_bound(True)


def test_finish_in_down_needs_four_blocks_per_consumer():
    """`down_decode(fin=)` (FINISH_IN_DOWN): a consumer finishes z over [blocks, 2, 64] with 4 warps along the
    blocks, so an inter size with fewer than 4 K blocks per consumer is refused before any launch, naming it."""
    from types import SimpleNamespace

    from dsv4.kernels import moe_glu_decode as mg

    small = SimpleNamespace(inter=512, hidden=1024)  # one range of 4 blocks: 2 per consumer
    assert mg._split(small, False) == 1
    with pytest.raises(ValueError, match="inter 512"):
        mg.down_decode(None, None, None, small, fin=(None, None, 0.0))
