"""E8M0 scale bytes and the power-of-two rounding used by every DeepSeek-V4 quantiser.

An E8M0 byte `b` is an unsigned exponent: value `2^(b - 127)`, `b = 255` is NaN, there is no zero
and no sign (checkpoint_format.md §5). Byte 0 is `2^-127`, an fp32 *subnormal*, so the usual
"shift the byte into the fp32 exponent field" trick is wrong for it and is special-cased here.
"""

from __future__ import annotations

import torch

E8M0_NAN_BYTE = 255
_FP32_MANTISSA_MASK = (1 << 23) - 1
_FP32_2_POW_M127_BITS = 1 << 22  # 2^-127 = subnormal with only the top mantissa bit set
_FP32_NAN_BITS = 0x7FC00000


def e8m0_bytes(t: torch.Tensor, name: str = "scale") -> torch.Tensor:
    """The raw exponent bytes (uint8) of an E8M0 tensor given as float8_e8m0fnu or uint8."""
    if t.dtype == torch.float8_e8m0fnu:
        return t.view(torch.uint8)
    if t.dtype == torch.uint8:
        return t
    raise ValueError(f"{name}: expected float8_e8m0fnu or uint8 E8M0 bytes, got {t.dtype}")


def e8m0_to_float(t: torch.Tensor, name: str = "scale") -> torch.Tensor:
    """Decode E8M0 bytes (float8_e8m0fnu or uint8) to float32: b -> 2^(b-127), 0 -> 2^-127, 255 -> nan."""
    b = e8m0_bytes(t, name).to(torch.int32)
    bits = b << 23
    bits = torch.where(b == 0, torch.full_like(bits, _FP32_2_POW_M127_BITS), bits)
    bits = torch.where(b == E8M0_NAN_BYTE, torch.full_like(bits, _FP32_NAN_BITS), bits)
    return bits.view(torch.float32)


def float_to_e8m0(t: torch.Tensor, name: str = "scale") -> torch.Tensor:
    """Encode exact powers of two in [2^-127, 2^127] as float8_e8m0fnu.

    Anything else (zero, negatives, NaN, inf, non-powers of two) raises ValueError naming the first
    offending value: a scale that is not a power of two would be silently rounded otherwise.
    """
    if not t.is_floating_point():
        raise ValueError(f"{name}: expected a floating-point tensor of powers of two, got {t.dtype}")
    x = t.detach().to(torch.float32)
    ok = torch.ones_like(x, dtype=torch.bool)
    if t.dtype == torch.float64:  # the fp32 view must not hide a non-power of two
        ok = x.to(torch.float64) == t
    bits = x.view(torch.int32)
    exponent = (bits >> 23) & 0xFF
    mantissa = bits & _FP32_MANTISSA_MASK
    normal_pow2 = (bits >= 0) & (exponent >= 1) & (exponent <= 254) & (mantissa == 0)
    is_min = bits == _FP32_2_POW_M127_BITS
    ok = ok & (normal_pow2 | is_min)
    if not bool(ok.all()):
        bad_index = int((~ok).flatten().nonzero()[0])
        bad_value = t.flatten()[bad_index].item()
        raise ValueError(
            f"{name}: value {bad_value!r} at flat index {bad_index} is not an exact power of two "
            f"in [2^-127, 2^127]; E8M0 cannot represent it"
        )
    byte = torch.where(is_min, torch.zeros_like(exponent), exponent)
    return byte.to(torch.uint8).view(torch.float8_e8m0fnu)


def pow2_ceil(t: torch.Tensor) -> torch.Tensor:
    """Power-of-two rounding of the DeepSeek kernels, bit-exact on fp32 bits.

    For the fp32 value with exponent field e and mantissa field f this returns the float whose bits
    are `(e + (f != 0)) << 23`, i.e. `2^(e - 127 + (f != 0))`. Consequences (all as in the
    reference kernels' `fast_pow2(fast_log2_ceil(v))`):
      * normal v > 0: the smallest power of two >= v; powers of two map to themselves;
      * the sign is ignored (pow2_ceil(-v) == pow2_ceil(v));
      * 0 -> 0.0 (2^-127 has no normal bit pattern), subnormals -> 2^-126;
      * v > 2^127 and inf -> inf.
    NaN maps to NaN (the reference's bit trick would give -0.0; callers floor amax so it never
    matters). Non-fp32 inputs are converted to fp32 first.
    """
    x = t.to(torch.float32)
    bits = x.view(torch.int32)
    exponent = (bits >> 23) & 0xFF
    mantissa_set = ((bits & _FP32_MANTISSA_MASK) != 0).to(torch.int32)
    out = ((exponent + mantissa_set) << 23).view(torch.float32)
    return torch.where(torch.isnan(x), x, out)
