"""dsv4.kernels.token_mask: the Triton mask kernel against the torch reference (bit-exact: a select), and the
reference against a numpy bit-by-bit derivation, on fresh random logits and words (rows without a mask, words
short of the vocabulary, a vocabulary that is no multiple of 32 or of the block)."""
from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from dsv4.kernels.token_mask import BLOCK, apply_token_masks, apply_token_masks_ref

DEV = os.environ.get("DSV4_TEST_DEVICE", "cuda")


def numpy_masks(logits: np.ndarray, words: np.ndarray) -> np.ndarray:
    """Bit v of a row: bit v % 32 of word v // 32, least significant first (little-endian bytes unpacked)."""
    bits = np.unpackbits(words.astype("<i4").view(np.uint8), axis=1, bitorder="little").astype(bool)
    vocab = logits.shape[1]
    keep = np.zeros_like(logits, dtype=bool)
    n = min(vocab, bits.shape[1])
    keep[:, :n] = bits[:, :n]
    return np.where(keep, logits, -np.inf)


@pytest.mark.parametrize("batch, vocab, short", [(1, 129280, 0), (5, 3 * BLOCK + 37, 0), (8, 1000, 3),
                                                 (64, 129280, 0)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_kernel_equals_the_reference(batch, vocab, short, dtype, poison):
    if DEV == "cpu" and batch == 64:
        pytest.skip("interpreter: the large batch on the GPU only")
    gen = torch.Generator().manual_seed(batch * 131 + vocab)
    logits = torch.randn(batch, vocab, generator=gen).to(dtype)
    nwords = (vocab + 31) // 32 - short  # short: the tokenizer's vocabulary ends before the model's
    words = torch.randint(-2**31, 2**31, (batch, nwords), generator=gen, dtype=torch.int64).to(torch.int32)
    words[1::3] = -1  # rows without a mask
    want = apply_token_masks_ref(logits, words)
    assert torch.equal(want.float(), torch.from_numpy(numpy_masks(logits.float().numpy(), words.numpy())).float())
    poison()
    got = apply_token_masks(logits.to(DEV), words.to(DEV)).cpu()
    assert got.dtype == dtype and torch.equal(got, want)
    kept = min(vocab, 32 * nwords)  # (past the words every column is masked)
    assert torch.isinf(got[0]).any() and torch.equal(got[1::3, :kept], logits[1::3, :kept])
    assert torch.isinf(got[:, kept:]).all()


def test_bad_shapes_name_the_argument():
    with pytest.raises(ValueError, match="words must be int32"):
        apply_token_masks_ref(torch.zeros(2, 64), torch.zeros(3, 2, dtype=torch.int32))
    with pytest.raises(ValueError, match="logits must be fp32/bf16"):
        apply_token_masks_ref(torch.zeros(2, 64, dtype=torch.float16), torch.zeros(2, 2, dtype=torch.int32))
