"""The batched decode step of unpaged states (a mixin of `Attention`): one token per sequence in rows 0..B-1, each
sequence's state (`dsv4.model.state`) updated on its own, then the indexer and the attention once over the batch
with every sequence's keys padded and masked. (Paged steps, `Attention._attend_step`, read fixed-shape pools
instead.) The mixin reads the layer's compressor, indexer, sink and scale.
"""
from __future__ import annotations

import torch
from torch.nn.utils.rnn import pad_sequence

from dsv4.model.context import Segment
from dsv4.model.sink_attention import lengths_mask, sink_attention_decode


class UnpagedDecode:
    """`Attention`'s batched decode over unpaged states (module docstring)."""

    def _attend_decode(self, pre, segments: list[Segment], out: torch.Tensor) -> torch.Tensor:
        """One token per sequence (rows 0..B-1): the state updates stay per sequence, the indexer and
        the attention run once over the batch, keys padded per sequence and masked out."""
        b, dev = len(segments), pre.q.device
        windows, entries, index_keys = [], [], []
        for i, seg in enumerate(segments):
            state, new_rows = seg.state, {}
            if self.compressor:
                c, z = pre.rows[0][i:i + 1], pre.rows[1][i:i + 1]
                self.compressor.update(state, c, z, pre.dtype)
                new_rows["main"] = (c, z)
                entries.append(state.entries("main"))
                if self.indexer:
                    c, z = pre.index_rows[0][i:i + 1], pre.index_rows[1][i:i + 1]
                    self.indexer.compressor.update(state, c, z, pre.dtype)
                    new_rows["index"] = (c, z)
                    index_keys.append(state.entries("index"))
            windows.append(state.window()[0])  # a copy: safe from the append below
            state.append_tokens(pre.kv[i:i + 1], new_rows)
        # every past window key is visible to the new token; left padding keeps them next to it
        keys = [pad_sequence(windows, batch_first=True, padding_side="left"), pre.kv[:b, None]]
        visible = [lengths_mask([w.shape[0] for w in windows], keys[0].shape[1], dev, left=True),
                   torch.ones(b, 1, dtype=torch.bool, device=dev)]
        if self.compressor:
            counts = [e.shape[0] for e in entries]
            keys.append(pad_sequence(entries, batch_first=True))
            present = lengths_mask(counts, keys[-1].shape[1], dev)
            if self.indexer and keys[-1].shape[1]:
                present = self.indexer.select_padded(pre.index_q[:b], pre.index_w[:b],
                                                     pad_sequence(index_keys, batch_first=True), present)
            visible.append(present)  # HCA: every complete entry
        sink_attention_decode(pre.q[:b], torch.cat(keys, 1), torch.cat(visible, 1), self.attn_sink, self.scale,
                               out[:b])
        return out
