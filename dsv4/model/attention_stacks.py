"""Kernel mode's stacked projections of one attention layer (a mixin of `Attention`): the linears that read one
input run as one GEMM.

* FP8 pairs (`fuse_fp8_pairs`, at finalize): wq_a | wkv read the attention input, wq_b | indexer.wq_b the q latent
  (this rank's wq_b heads over the whole indexer when sharded); batch-1 decode runs one GEMM launch per pair.
* bf16 linears of the attention input besides wq_a / wkv (compressors, indexer head weights): one GEMM over
  `fused_input_weight` into fp32, then one epilogue launch (`_project_fused`).

The mixin reads the layer's linears (wq_a, wkv, wq_b, compressor, indexer) and keeps its stacks in `_fused` and
`_fp8_stacks` (set up by `Attention.__init__`).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from dsv4.model.linear import Linear, bf16_gemm_fp32, stack_fp8_linears, stacked_fp8_forward
from dsv4.model.numerics import acc_dtype


class StackedProjections:
    """The stacked projections of `Attention` (module docstring)."""

    # The FP8 linears that share an input as one GEMM per pair (batch-1 decode).

    def fp8_pairs(self) -> dict[str, list[Linear]]:
        """The FP8 linears that read one input: wq_a | wkv (the attention input), wq_b | indexer.wq_b
        (the q latent; CSA layers)."""
        pairs = {"a": [self.wq_a, self.wkv]}
        if self.indexer:
            pairs["q_latent"] = [self.wq_b, self.indexer.wq_b]
        return pairs

    def fuse_fp8_pairs(self) -> None:
        """Kernel mode, at finalize: stack each pair into one FP8 weight (`stack_fp8_linears`; the
        linears' weights and scales become its row views). A stack the linears still alias is kept
        (reloads write through), otherwise restacked; pairs that are not both FP8 stay separate."""
        for name, lins in self.fp8_pairs().items():
            stack = self._fp8_stacks.get(name)
            if stack is None or not stack.intact():
                stack = stack_fp8_linears(lins)
            if stack is None:
                self._fp8_stacks.pop(name, None)
            else:
                self._fp8_stacks[name] = stack

    def _fp8_pair(self, name: str, x: torch.Tensor) -> list[torch.Tensor]:
        """The pair's outputs for x (its activation quantisation is the kernel's). One GEMM over the
        stack for a single row, where its column slices are contiguous (with more rows norm_rope would
        copy each); else, or where no launch is bit-identical (`stacked_fp8_forward`), one per linear, in
        order. (Session 47: the second beside the first on the side stream, where Flash's wq_b | indexer.wq_b
        take different kernels at one row, measured no faster: 8-layer B = 1 replay 1.19 / 1.19 vs 1.19 / 1.20 /
        1.19 ms, B = 8 2.99 / 2.99 vs 2.98 / 2.98 / 3.00, and was removed.)"""
        stack = self._fp8_stacks.get(name)
        ys = stacked_fp8_forward(stack, x) if stack is not None and x.numel() == x.shape[-1] else None
        if ys is not None:
            return ys
        first, second = self.fp8_pairs()[name]
        return [first(x, input_ready=True), second(x, input_ready=True)]

    # Kernel mode: the bf16 linears that read `a` (compressors, indexer head weights) as one GEMM.

    def fused_linears(self) -> list[Linear]:
        """The bf16 linears of `a` besides wq_a/wkv, in the fused weight's row order:
        main wkv | main wgate | index wkv | index wgate | weights_proj (sliding layers: none)."""
        if self.compressor is None:
            return []
        lins = [self.compressor.wkv, self.compressor.wgate]
        if self.indexer:
            lins += [self.indexer.compressor.wkv, self.indexer.compressor.wgate, self.indexer.weights_proj]
        return lins

    def fused_input_weight(self) -> torch.Tensor:
        """`fused_linears`' weights row-stacked [N, D], built at finalize (kernel mode) or on first use. From then
        on each linear's weight *is* its row block (a view): no second copy, and a reload (an in-place copy into
        the weights) updates the stack too. Rebuilt when a weight was replaced since (`.to()`, a new Parameter)."""
        lins = self.fused_linears()
        if self._fused is not None and [lin.weight.data_ptr() for lin in lins] == self._fused[1]:
            return self._fused[0]
        for lin in lins:
            if lin.kernel_format is not None or lin.quantize_input:
                raise RuntimeError(f"layer {self.layer_index}: fused projections need plain bf16 linears ({lin})")
        with torch.inference_mode(False), torch.no_grad():  # normal tensors: later loads copy into them
            old = [lin.weight.detach() for lin in lins]
            stacked = torch.cat(old)
            if stacked.is_cuda:  # a rebuild inside a side-stream branch (`_project_fused`): the old weights,
                # allocated on the main stream and freed below, must not be reused before this stream's cat read
                # them (session 46: they were, and the stack took the main stream's next activations)
                for w in old:
                    w.record_stream(torch.cuda.current_stream(stacked.device))
            row = 0
            for lin in lins:
                lin.weight.data = stacked[row:row + lin.out_features]
                lin.invalidate_cache()
                row += lin.out_features
        self._fused = (stacked, [lin.weight.data_ptr() for lin in lins])
        return stacked

    def _apply(self, fn, recurse=True):  # .to()/.cuda() give the linears new weights: drop the old stacks
        self._fused = None
        self._fp8_stacks = {}  # the pairs run separately until the next finalize stacks them again
        return super()._apply(fn, recurse)

    def _project_fused(self, a: torch.Tensor, positions: torch.Tensor
                       ) -> tuple[tuple, tuple | None, torch.Tensor | None]:
        """(rows, index_rows, index_w) as `Compressor.project` and `weights_proj(a) * weight_scale`
        compute them: one GEMM into fp32 over `fused_input_weight`, then one launch
        (dsv4.kernels.projections) adds each compressor's ape to its gate columns in place and rounds the
        head weights. With `projections.DECODE_GEMV` (the default) up to DECODE_MAX_T bf16 rows run both in
        one launch (`project_decode`). The rows are column views of the GEMM output."""
        from dsv4.kernels import projections as pj
        weight = self.fused_input_weight()
        width = self.compressor.wkv.out_features
        gates, head = [(width, self.compressor.ape)], None
        if self.indexer:
            col, iw = 2 * width, self.indexer.compressor.wkv.out_features
            gates.append((col + iw, self.indexer.compressor.ape))
            head = (col + 2 * iw, self.indexer.n_heads, self.indexer.weight_scale)
        if pj.DECODE_GEMV and pj.HAS_TRITON and (a.is_cuda or pj.INTERPRET) and a.dim() == 2 \
                and a.shape[0] <= pj.DECODE_MAX_T and a.stride(1) == 1 and a.dtype == weight.dtype == torch.bfloat16:
            y, index_w = pj.project_decode(a, weight, positions, gates, head)
        else:
            y = bf16_gemm_fp32(a, weight)
            if y is None:  # CPU / other dtypes: the GEMM in the accumulation dtype, as Linear does
                acc = acc_dtype(a.dtype)
                y = F.linear(a.to(acc), weight.to(acc))
            kernel = pj.HAS_TRITON and (y.is_cuda or pj.INTERPRET)
            index_w = (pj.finish_projections if kernel else pj.finish_projections_ref)(y, positions, gates, head)
        rows = (y[:, :width], y[:, width:2 * width])
        index_rows = None
        if self.indexer:
            index_rows = (y[:, col:col + iw], y[:, col + iw:col + 2 * iw])
        return rows, index_rows, index_w
