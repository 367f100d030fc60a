"""Triton kernels, each beside a torch reference of the same signature (`*_ref`).

`import dsv4.kernels` works without triton (CPU CI); the Triton entry points then raise on use.
"""

from dsv4.kernels.fp8_linear import (
    HAS_TRITON,
    LinearConfig,
    act_quant,
    act_quant_ref,
    fp8_gemm,
    fp8_gemm_ref,
    fp8_linear,
    fp8_linear_ref,
    grouped_fp8_linear,
    grouped_fp8_linear_ref,
    grouped_linear_bf16,
    grouped_linear_bf16_ref,
    pick_linear_config,
)
from dsv4.kernels.moe import MoEConfig, fused_moe, fused_moe_ref, pick_moe_config
from dsv4.kernels.moe_layout import ExpertWeights, PackedExperts, finalize_experts, repack_fp4
from dsv4.kernels.moe_align import max_blocks, moe_align, moe_align_ref

__all__ = [
    "HAS_TRITON", "LinearConfig", "act_quant", "act_quant_ref", "fp8_gemm", "fp8_gemm_ref", "fp8_linear",
    "fp8_linear_ref", "grouped_fp8_linear", "grouped_fp8_linear_ref", "grouped_linear_bf16",
    "grouped_linear_bf16_ref", "pick_linear_config", "ExpertWeights", "MoEConfig", "PackedExperts",
    "finalize_experts", "fused_moe", "fused_moe_ref", "pick_moe_config", "repack_fp4", "max_blocks",
    "moe_align", "moe_align_ref",
]
