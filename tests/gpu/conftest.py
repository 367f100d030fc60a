"""GPU tests: skipped unless CUDA and triton are present (run them through the device tool)."""

from __future__ import annotations

import os

import pytest
import torch


def _gpu_ready() -> bool:
    if os.environ.get("DSV4_TEST_DEVICE") == "cpu" and os.environ.get("TRITON_INTERPRET") == "1":
        return True  # the tests through Triton's interpreter (`make test` runs its KERNEL_TESTS files this way)
    if not torch.cuda.is_available():
        return False
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


def pytest_collection_modifyitems(config, items):
    if _gpu_ready():
        return
    skip = pytest.mark.skip(reason="needs CUDA and triton (run through the device tool)")
    for item in items:
        if "tests/gpu/" in str(item.fspath).replace("\\", "/"):
            item.add_marker(skip)


@pytest.fixture
def poison():
    """Fill the CUDA caching allocator's free blocks with 0xFF bytes (NaN in fp32/bf16/e4m3, -1 in int32),
    so an output element that a kernel forgets to write shows up as NaN or garbage."""

    def _poison() -> None:
        if not torch.cuda.is_available():
            return
        blocks = []
        for size, count in ((1 << 16, 64), (1 << 21, 32), (1 << 26, 8)):
            for _ in range(count):
                blocks.append(torch.full((size,), 0xFF, dtype=torch.uint8, device="cuda"))
        del blocks

    return _poison


@pytest.fixture
def close_bf16():
    """The bf16-result comparison below, as a fixture (test modules cannot import conftest)."""
    return assert_close_bf16


def rel_err(y: torch.Tensor, ref: torch.Tensor) -> float:
    y, ref = y.double(), ref.double()
    return float((y - ref).norm() / ref.norm().clamp_min(1e-30))


def assert_close_bf16(y: torch.Tensor, ref: torch.Tensor, rel: float = 2e-3, what: str = "") -> None:
    """Both bf16 results of the same fp32 math: a few 1-ulp rounding flips at most."""
    assert y.shape == ref.shape, f"{what}: shape {tuple(y.shape)} != {tuple(ref.shape)}"
    assert torch.isfinite(y).all(), f"{what}: non-finite output (unwritten elements?)"
    err = rel_err(y, ref)
    assert err < rel, f"{what}: relative error {err:.2e} >= {rel:.0e}"
    worst = float((y.double() - ref.double()).abs().max())
    assert worst <= 0.02 * float(ref.double().abs().max()), f"{what}: max abs diff {worst}"


def assert_graph_replays(fn, static_x: torch.Tensor, inputs: list, expected: list, what: str = "") -> None:
    """Capture `fn(static_x)` once (its buffers and counters allocated beforehand); replaying it after
    copying inputs[i % n] into static_x must give expected[i % n] bit for bit."""
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_y = fn(static_x)
    for i in range(6):
        static_x.copy_(inputs[i % len(inputs)])
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(static_y, expected[i % len(expected)]), f"{what} replay {i}"


@pytest.fixture
def graph_replays():
    return assert_graph_replays


@pytest.fixture
def eager_prefill(monkeypatch):
    """CUDA graphs for the decode steps only, prefills eager: for the tests that compare graphed decoding with the
    eager forward bit for bit or token for token (a prefill padded to its piece bucket may take other GEMM shapes,
    dsv4.model.prefill_graphs; tests/gpu/test_prefill_pieces_gpu.py covers the pieces)."""
    from dsv4.model import prefill_graphs
    monkeypatch.setattr(prefill_graphs, "PREFILL_MAX_TOKENS", 0)
