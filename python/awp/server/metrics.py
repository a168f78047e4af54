"""Prometheus metrics of one ``awp serve`` process, in their own registry (served at ``/metrics``).

Counters and histograms are updated as requests and coordinator passes happen; the gauges of database
state (runs, dispatches, workers by status, active leases, ready tasks per executor kind that no active
worker offers) are refreshed from ``awp.metrics_snapshot()``
at scrape time, so they cost one cheap query per scrape and nothing otherwise. Per executor kind (ready tasks,
pending and leased dispatches, worker slots and free slots) they come from ``awp.executor_stats()`` in the same
query; ``awp_limit_bound_passes_total{limit}`` counts the coordinator passes after which a limit still held
ready tasks back (docs/limits.md). ``awp_auth_failures_total{reason}`` counts 401 answers and
``awp_http_timeouts_total{phase}`` the connections of slow clients cut (docs/operations.md).
"""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from awp.protocol.statuses import RUN_STATUSES

LIVE_DISPATCH_STATUSES = ("pending", "leased")
WORKER_STATUSES = ("active", "draining", "stopped", "offline")
PRUNED_KINDS = ("runs", "tasks", "dispatches", "attempts", "events", "workers", "idempotency_keys", "partitions")
COORDINATOR_COUNTS = (
    "canceled",
    "reaped",
    "offline",
    "promoted",
    "withdrawn",
    "dispatched",
    "schedules_fired",
    "resumed",  # leases resumed after an outage (docs/protocol.md, Lease recovery)
    "children",  # child-run tasks settled, tasks run by the database started (docs/dynamic.md)
    "waits",  # sleeps ended, signal waits timed out (docs/waits.md)
)
# The limits a coordinator pass can find holding ready tasks back ("limited" in its answer; docs/limits.md).
LIMITS = ("run_concurrency", "workers_full", "dispatch_limit", "no_worker_for_executor", "no_worker_for_action")
# Why a request failed authentication: no bearer token (on the dashboard: no valid session), a token that matches
# nothing, a worker session token the database refused.
AUTH_FAILURE_REASONS = ("missing", "invalid", "worker_session")
# What a slow client did not send in time: a request head (an idle new connection too), a request body.
TIMEOUT_PHASES = ("head", "body")

CONTENT_TYPE = CONTENT_TYPE_LATEST


class Metrics:
    def __init__(self) -> None:
        disable_created_metrics()  # no *_created series: they double the output for nothing
        r = self.registry = CollectorRegistry(auto_describe=True)
        self._request_children: dict[tuple[str, str, int], tuple[Any, Any]] = {}
        self.requests = Counter(
            "awp_http_requests", "HTTP requests answered", ["method", "route", "status"], registry=r
        )
        self.latency = Histogram(
            "awp_http_request_duration_seconds",
            "HTTP request latency",
            ["method", "route"],
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
            registry=r,
        )
        self.claims = Counter("awp_claims", "Claim requests answered, by result", ["result"], registry=r)
        self.leases_issued = Counter("awp_leases_issued", "Leases handed out by this gateway", registry=r)
        self.completions = Counter("awp_completions", "Completions by whether they applied", ["applied"], registry=r)
        self.grouped_calls = Counter(
            "awp_grouped_completion_calls", "Calls that completed several workers' completions together", registry=r
        )
        self.grouped_completions = Counter(
            "awp_grouped_completions", "Completions sent in a call together with others", registry=r
        )
        self.coordinator_active = Gauge(
            "awp_coordinator_active", "1 when this replica is the active coordinator", registry=r
        )
        self.coordinator_passes = Counter("awp_coordinator_passes", "Coordinator passes run", registry=r)
        self.coordinator_pass_seconds = Histogram(
            "awp_coordinator_pass_duration_seconds",
            "Duration of one coordinator pass",
            buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 5),
            registry=r,
        )
        self.coordinator_items = Counter(
            "awp_coordinator_items", "Items handled by coordinator passes, by kind", ["kind"], registry=r
        )
        self.reaped_leases = Counter("awp_reaped_leases", "Leases reaped (expired or past deadline)", registry=r)
        self.database_up = Gauge("awp_database_up", "1 when the last scrape reached the database", registry=r)
        self.leases_active = Gauge("awp_leases_active", "Leased dispatches in the database", registry=r)
        self.dispatches = Gauge("awp_dispatches", "Live dispatches in the database by status", ["status"], registry=r)
        self.runs = Gauge("awp_runs", "Runs in the database by status", ["status"], registry=r)
        self.workers = Gauge("awp_workers", "Worker sessions in the database by status", ["status"], registry=r)
        self.ready_without_worker = Gauge(
            "awp_ready_tasks_without_worker",
            "Ready tasks whose executor kind no active worker offers (they wait until one registers)",
            ["executor_kind"],
            registry=r,
        )
        # Per executor kind (docs/limits.md), from awp.executor_stats() at scrape time: live rows only.
        self.executor_ready = Gauge(
            "awp_executor_ready_tasks", "Ready tasks of live runs, by executor kind", ["executor_kind"], registry=r
        )
        self.executor_pending = Gauge(
            "awp_executor_pending_dispatches",
            "Pending dispatches (waiting for a claim), by executor kind",
            ["executor_kind"],
            registry=r,
        )
        self.executor_leased = Gauge(
            "awp_executor_leased_dispatches",
            "Leased dispatches (running), by executor kind",
            ["executor_kind"],
            registry=r,
        )
        self.executor_slots = Gauge(
            "awp_executor_worker_slots",
            "Slots (max_concurrency) of active workers offering the kind",
            ["executor_kind"],
            registry=r,
        )
        self.executor_free_slots = Gauge(
            "awp_executor_free_worker_slots",
            "Slots not leased of active workers offering the kind",
            ["executor_kind"],
            registry=r,
        )
        self.executor_workers = Gauge(
            "awp_executor_workers", "Active workers offering the kind", ["executor_kind"], registry=r
        )
        # Per named rate limit (docs/limits.md), from awp.metrics_snapshot(): one label per defined limit (an
        # operator's choice, not one per key), gone when the limit is deleted.
        self.rate_limit_in_flight = Gauge(
            "awp_rate_limit_in_flight", "Queued + running tasks holding the limit (any key)", ["limit"], registry=r
        )
        self.rate_limit_held = Gauge(
            "awp_rate_limit_held_tasks",
            "Ready tasks the limit holds back (wait reason rate_limited)",
            ["limit"],
            registry=r,
        )
        self.dispatch_limit = Gauge(
            "awp_dispatch_limit", "The global dispatch_limit setting (pending + leased at most)", registry=r
        )
        # Which limits held ready tasks back after each coordinator pass of this replica.
        self.limit_bound = Counter(
            "awp_limit_bound_passes",
            "Coordinator passes after which this limit still held ready tasks back",
            ["limit"],
            registry=r,
        )
        self.limit_holding = Gauge(
            "awp_limit_holding", "1 when this limit held ready tasks back after the latest pass", ["limit"], registry=r
        )
        for limit in LIMITS:
            self.limit_bound.labels(limit)
            self.limit_holding.labels(limit)
        for kind in COORDINATOR_COUNTS:
            self.coordinator_items.labels(kind)
        for result in ("empty", "leased"):
            self.claims.labels(result)
        self.auth_failures = Counter(
            "awp_auth_failures", "Requests answered 401 (failed authentication), by reason", ["reason"], registry=r
        )
        for reason in AUTH_FAILURE_REASONS:
            self.auth_failures.labels(reason)
        self.http_timeouts = Counter(
            "awp_http_timeouts",
            "Connections cut because a request head or body did not arrive in time, by phase",
            ["phase"],
            registry=r,
        )
        for phase in TIMEOUT_PHASES:
            self.http_timeouts.labels(phase)
        # Retention (docs/retention.md): what the active coordinator's background prune batches deleted.
        self.pruned = Counter("awp_pruned", "Rows deleted by retention, by kind", ["kind"], registry=r)
        self.retention_batches = Counter("awp_retention_batches", "Retention batches run", registry=r)
        self.retention_batch_seconds = Histogram(
            "awp_retention_batch_duration_seconds",
            "Duration of one retention batch (awp.apply_retention)",
            buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 5),
            registry=r,
        )
        for kind in PRUNED_KINDS:
            self.pruned.labels(kind)

    def observe_group(self, items: int) -> None:
        """One call of ``awp.complete_and_claim_many`` with ``items`` completions (python/awp/server/grouping.py)."""
        self.grouped_calls.inc()
        self.grouped_completions.inc(items)

    def observe_request(self, method: str, route: str, status: int, seconds: float) -> None:
        # The children of (method, route, status) are kept: .labels() checks and joins its labels every time.
        children = self._request_children.get((method, route, status))
        if children is None:
            children = self.requests.labels(method, route, str(status)), self.latency.labels(method, route)
            self._request_children[(method, route, status)] = children
        children[0].inc()
        children[1].observe(seconds)

    def observe_pass(self, counts: dict[str, Any], seconds: float) -> None:
        self.coordinator_passes.inc()
        self.coordinator_pass_seconds.observe(seconds)
        for kind, n in counts.items():
            if isinstance(n, int) and not isinstance(n, bool) and n:
                self.coordinator_items.labels(kind).inc(n)
        if "limited" in counts:  # the limits still holding ready tasks back after this pass
            held = set(counts.get("limited") or ())
            for limit in sorted(held | set(LIMITS)):
                if limit in held:
                    self.limit_bound.labels(limit).inc()
                self.limit_holding.labels(limit).set(1 if limit in held else 0)
        if counts.get("reaped"):
            self.reaped_leases.inc(counts["reaped"])

    def observe_retention(self, counts: dict[str, Any], seconds: float) -> None:
        self.retention_batches.inc()
        self.retention_batch_seconds.observe(seconds)
        for kind in PRUNED_KINDS:
            n = counts.get(kind)
            if isinstance(n, int) and n > 0:
                self.pruned.labels(kind).inc(n)

    def set_snapshot(self, snapshot: dict[str, Any] | None) -> None:
        if snapshot is None:
            self.database_up.set(0)
            return
        self.database_up.set(1)
        self.leases_active.set(int(snapshot.get("leases_active", 0)))
        for name, gauge, statuses in (
            ("runs", self.runs, RUN_STATUSES),
            ("dispatches", self.dispatches, LIVE_DISPATCH_STATUSES),
            ("workers", self.workers, WORKER_STATUSES),
        ):
            counts = snapshot.get(name) or {}
            for status in statuses:
                gauge.labels(status).set(int(counts.get(status, 0)))
        # Only the kinds that wait now: a kind a worker came for drops out of the scrape.
        self.ready_without_worker.clear()
        for kind, n in (snapshot.get("ready_without_worker") or {}).items():
            self.ready_without_worker.labels(kind).set(int(n))
        if "rate_limits" in snapshot:
            self.rate_limit_in_flight.clear()
            self.rate_limit_held.clear()
            for limit, counts in (snapshot.get("rate_limits") or {}).items():
                self.rate_limit_in_flight.labels(limit).set(int((counts or {}).get("in_flight", 0)))
                self.rate_limit_held.labels(limit).set(int((counts or {}).get("held", 0)))
        if snapshot.get("dispatch_limit") is not None:
            self.dispatch_limit.set(int(snapshot["dispatch_limit"]))
        if "executors" in snapshot:  # the kinds known now (awp.executor_stats): a kind gone drops out
            gauges = {
                "ready": self.executor_ready,
                "pending": self.executor_pending,
                "leased": self.executor_leased,
                "slots": self.executor_slots,
                "free_slots": self.executor_free_slots,
                "workers": self.executor_workers,
            }
            for gauge in gauges.values():
                gauge.clear()
            for kind, stats in (snapshot.get("executors") or {}).items():
                for name, gauge in gauges.items():
                    gauge.labels(kind).set(int((stats or {}).get(name, 0)))

    def render(self) -> bytes:
        return generate_latest(self.registry)
