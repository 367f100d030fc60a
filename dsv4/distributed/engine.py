"""The engine in a multi-process run: every rank runs the same `LLMEngine` loop in lock-step.

Each rank owns a full `LLMEngine` around its shard of the model. The engine is deterministic given
its inputs (requests, aborts, sampled ids), so the ranks stay in step when

* rank 0 alone takes requests and aborts (HTTP server, CLI) and, at every `step()`, broadcasts the
  ones that arrived since the previous step; each worker applies them in the same order and steps;
* rank 0 alone samples and broadcasts the sampled ids (`BroadcastSampler`), so per-request
  generators and torch's global RNG never have to agree across processes. The engine's look-ahead
  (`EngineConfig.overlap`) gets them on the device, by a broadcast over the model's process group.

The model's collectives inside `step()` then line up by construction. Messages travel over the gloo
control group (`ParallelState.control_group`, long timeout: a server may idle for hours).

    rank 0:  core = DistributedEngine(engine, ps); ... core.add_request/step ...; core.shutdown()
    others:  worker_loop(engine, ps)      # returns after rank 0's shutdown()
    or, on every rank:  lockstep(engine, ps, lambda core: ...)

* with speculative decoding, rank 0 alone draws the drafts and judges them (`MTPSpeculator.decide`)
  and broadcasts the outcome, so every rank runs the same chained MTP rows and state rollbacks; greedy
  drafts and verdicts picked on the device are rank 0's by a broadcast of the ids (`MTPSpeculator.share`).
"""
from __future__ import annotations

import logging

import torch
import torch.distributed as dist

from dsv4.distributed.parallel_state import ParallelState, broadcast_object

log = logging.getLogger(__name__)


class BroadcastSampler:
    """Rank 0 samples with the engine's sampler; every rank gets rank 0's `SamplerOutput`."""

    def __init__(self, inner, ps: ParallelState):
        self.inner, self.ps = inner, ps

    def sample_sequences(self, logits, seqs):
        out = self.inner.sample_sequences(logits, seqs) if self.ps.is_first else None
        return broadcast_object(out, self.ps)

    def pick_sequences(self, logits, seqs):
        """Rank 0's ids, left on every rank's device (the engine's look-ahead): a broadcast over the model's
        group (NCCL on GPUs), queued on the stream like the step's other collectives, not waited for."""
        return _rank0_ids(self.inner.pick_sequences(logits, seqs) if self.ps.is_first
                          else torch.empty(len(seqs), dtype=torch.long, device=logits.device))

    def __getattr__(self, name: str):
        return getattr(self.inner, name)


def share_decisions(engine, ps: ParallelState) -> None:
    """Make rank 0 the only one that samples, drafts and judges drafts; the others receive its results."""
    engine.sampler = BroadcastSampler(engine.sampler, ps)
    if getattr(engine, "speculator", None) is not None:
        engine.speculator.decide = lambda fn: broadcast_object(fn() if ps.is_first else None, ps)
        engine.speculator.share = _rank0_ids


def _rank0_ids(ids: torch.Tensor) -> torch.Tensor:
    """Rank 0's ids in place of this rank's, on the device (queued on the stream, not waited for)."""
    dist.broadcast(ids, src=0)
    return ids


def _apply(engine, commands: list[tuple]) -> None:
    for cmd in commands:
        if cmd[0] == "add":
            engine.add_request(cmd[1], cmd[2], cmd[3])
        elif cmd[0] == "abort":
            engine.abort_request(cmd[1])
        else:
            raise RuntimeError(f"unknown engine command {cmd[0]!r}")


class DistributedEngine:
    """Rank 0's engine core (the `EngineCore` protocol of dsv4.engine.async_engine)."""

    def __init__(self, engine, ps: ParallelState):
        if not ps.is_first:
            raise ValueError("DistributedEngine runs on rank 0; the other ranks run worker_loop")
        self.engine, self.ps = engine, ps
        share_decisions(engine, ps)
        self._pending: list[tuple] = []
        self._stopped = False

    def __getattr__(self, name: str):  # max_model_len, tokenizer, model_name, config, ...
        return getattr(self.engine, name)

    def add_request(self, request_id: str, prompt_token_ids: list[int], params=None) -> None:
        # validated (and queued) here first: a refused request never reaches the workers
        self.engine.add_request(request_id, prompt_token_ids, params)
        self._pending.append(("add", request_id, [int(t) for t in prompt_token_ids], params))

    def abort_request(self, request_id: str) -> None:
        self.engine.abort_request(request_id)
        self._pending.append(("abort", request_id))

    def has_unfinished(self) -> bool:
        return self.engine.has_unfinished()

    def stats(self):
        return self.engine.stats()

    def step(self):
        if self._stopped:
            raise RuntimeError("DistributedEngine.step after shutdown")
        commands, self._pending = self._pending, []
        broadcast_object(("step", commands), self.ps)
        return self.engine.step()

    def shutdown(self) -> None:
        """Release the workers (idempotent)."""
        if not self._stopped:
            self._stopped = True
            broadcast_object(("stop", []), self.ps)


def worker_loop(engine, ps: ParallelState) -> None:
    """Follow rank 0: apply its requests/aborts, step when it steps; return when it shuts down."""
    if ps.is_first:
        raise ValueError("worker_loop runs on ranks other than 0")
    share_decisions(engine, ps)
    steps = 0
    while True:
        kind, commands = broadcast_object(None, ps)
        _apply(engine, commands)
        if kind == "stop":
            log.info("rank %d: stop after %d steps", ps.rank, steps)
            return
        engine.step()
        steps += 1


def lockstep(engine, ps: ParallelState, lead):
    """Every rank's part of a lock-stepped run: rank 0 runs `lead(core)` on a `DistributedEngine` around its
    engine and releases the workers afterwards (also when `lead` raises), returning its result; the
    other ranks follow rank 0 until then (`worker_loop`) and return None."""
    if not ps.is_first:
        worker_loop(engine, ps)
        return None
    core = DistributedEngine(engine, ps)
    try:
        return lead(core)
    finally:
        core.shutdown()
