"""Prometheus metrics of one server (own registry, so several apps can live in one process).

Latencies are observed by the app as deltas reach the client side of the engine; queue, running
and cache-page gauges are copied from the engine's stats on every scrape.
"""
from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)


class ServerMetrics:
    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self.ttft = Histogram("dsv4_time_to_first_token_seconds", "Time from admission to the first token",
                              buckets=LATENCY_BUCKETS, registry=r)
        self.itl = Histogram("dsv4_inter_token_latency_seconds", "Time between generated tokens",
                             buckets=LATENCY_BUCKETS, registry=r)
        self.e2e = Histogram("dsv4_request_latency_seconds", "Admission to last token",
                             buckets=LATENCY_BUCKETS, registry=r)
        self.step = Histogram("dsv4_engine_step_seconds", "Duration of one engine step",
                              buckets=LATENCY_BUCKETS, registry=r)
        self.queue = Gauge("dsv4_num_requests_waiting", "Sequences waiting to be scheduled", registry=r)
        self.running = Gauge("dsv4_num_requests_running", "Sequences being generated", registry=r)
        self.pending = Gauge("dsv4_num_requests_in_flight", "Sequences admitted by the server, not finished",
                             registry=r)
        self.cache_usage = Gauge("dsv4_cache_usage_ratio", "Fraction of cache pages in use (max over kinds)",
                                 registry=r)
        self.kind_usage = Gauge("dsv4_cache_kind_usage_ratio", "Fraction of cache pages in use", ["kind"],
                                registry=r)
        self.free_pages = Gauge("dsv4_cache_free_pages", "Free cache pages (all kinds)", registry=r)
        self.total_pages = Gauge("dsv4_cache_total_pages", "All cache pages (all kinds)", registry=r)
        self.shared_pages = Gauge("dsv4_cache_shared_pages", "Cache pages held by several sequences or snapshots "
                                  "(a shared prompt prefix's entries, stored once)", registry=r)
        self.preemptions = Gauge("dsv4_num_preemptions", "Preemptions since start", registry=r)
        self.spec_drafts = Gauge("dsv4_spec_draft_tokens", "Speculative draft tokens proposed since start", registry=r)
        self.spec_accepted = Gauge("dsv4_spec_accepted_tokens", "Speculative draft tokens accepted since start",
                                   registry=r)
        self.spec_rate = Gauge("dsv4_spec_acceptance_rate", "Accepted / proposed draft tokens", registry=r)
        self.look_aheads = Gauge("dsv4_look_ahead_steps", "Engine steps that launched the next batch before reading "
                                 "their ids (overlap) since start", registry=r)
        self.look_ahead_wasted = Gauge("dsv4_look_ahead_wasted_rows", "Look-ahead rows computed for a sequence that "
                                       "had stopped since start", registry=r)
        self.retained = Gauge("dsv4_retained_sequences", "Finished sequences holding their cache for a "
                              "continuation (--retain-finished)", registry=r)
        self.adopted_tokens = Gauge("dsv4_adopted_prompt_tokens", "Prompt tokens taken from retained sequences "
                                    "instead of computed, since start", registry=r)
        self.shared_tokens = Gauge("dsv4_shared_prompt_tokens", "Prompt tokens copied from a running sequence with "
                                   "the same prompt instead of computed, since start", registry=r)
        self.snapshots = Gauge("dsv4_prefix_snapshots", "Prompt-prefix snapshots kept (--prefix-snapshots)",
                               registry=r)
        self.prompt_tokens = Counter("dsv4_prompt_tokens", "Prompt tokens of admitted requests", registry=r)
        self.generation_tokens = Counter("dsv4_generation_tokens", "Tokens generated", registry=r)
        self.requests = Counter("dsv4_requests", "Finished sequences", ["finish_reason"], registry=r)
        self.structured = Counter("dsv4_structured_requests", "Admitted sequences with a structured output (forced "
                                  "tool calls count as grammar)", ["kind"], registry=r)
        self.rejected = Counter("dsv4_rejected_requests", "Requests answered with an error status", ["status"],
                                registry=r)

    def refresh(self, stats, pending: int) -> None:
        self.queue.set(stats.num_waiting)
        self.running.set(stats.num_running)
        self.pending.set(pending)
        self.cache_usage.set(stats.cache_usage)
        for kind, value in getattr(stats, "page_usage", {}).items():
            self.kind_usage.labels(kind).set(value)
        self.free_pages.set(stats.free_pages)
        self.total_pages.set(stats.total_pages)
        self.shared_pages.set(getattr(stats, "shared_pages", 0))
        self.preemptions.set(stats.num_preemptions)
        drafts, accepted = getattr(stats, "spec_draft_tokens", 0), getattr(stats, "spec_accepted_tokens", 0)
        self.spec_drafts.set(drafts)
        self.spec_accepted.set(accepted)
        self.spec_rate.set(accepted / drafts if drafts else 0.0)
        self.look_aheads.set(getattr(stats, "look_ahead_steps", 0))
        self.look_ahead_wasted.set(getattr(stats, "look_ahead_wasted_rows", 0))
        self.retained.set(getattr(stats, "num_retained", 0))
        self.adopted_tokens.set(getattr(stats, "adopted_tokens", 0))
        self.shared_tokens.set(getattr(stats, "shared_prompt_tokens", 0))
        self.snapshots.set(getattr(stats, "num_snapshots", 0))

    def render(self) -> bytes:
        return generate_latest(self.registry)
