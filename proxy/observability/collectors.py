"""Metrics read at scrape time from the objects that own the facts: backends and learned stats.

Reading them when Prometheus asks costs nothing on the request path and can never drift from
the truth the admin endpoints show.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import TYPE_CHECKING, get_args

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily
from prometheus_client.registry import Collector

from proxy.observability.depth_now import depth_now
from proxy.plans.speculation import backend_speculation
from proxy.routing.now import busy_epochs
from supervisor.draft_probe import DraftControl
from supervisor.states import BackendState
from supervisor.template_check import LateSystem

if TYPE_CHECKING:
    from prometheus_client.metrics_core import Metric

    from proxy.state import ProxyState


class BackendsCollector(Collector):
    """Each backend's state, load and speculative type, auto's draft control, the queues and
    what was learned."""

    def __init__(self, state: ProxyState) -> None:
        self._state = state

    def collect(self) -> Iterator[Metric]:
        yield from self._backend_metrics()
        yield self._speculation_metric()
        yield self._draft_control_metric()
        yield self._busy_depth_metric()
        yield self._depth_now_metric()
        yield self._late_system_metric()
        yield from self._queue_metrics()
        if self._state.settings.server.vllm_metrics:
            yield from self._vllm_metrics()
        yield from self._learned_metrics()
        yield from self._guard_metrics()

    def _backend_metrics(self) -> Iterator[Metric]:
        labels = ["backend", "model", "profile"]
        in_flight = GaugeMetricFamily(
            "mtp_proxy_backend_in_flight", "Requests being served by each backend.", labels=labels
        )
        state = GaugeMetricFamily(
            "mtp_proxy_backend_state",
            "1 for the state each backend is in, 0 for the others.",
            labels=[*labels, "state"],
        )
        ready = GaugeMetricFamily(
            "mtp_proxy_backend_ready", "1 when the backend takes requests.", labels=labels
        )
        slots = GaugeMetricFamily(
            "mtp_proxy_backend_slots",
            "Requests each backend serves at once (its llama-server -np); in-flight beyond it "
            "would queue inside llama-server, so the proxy queues instead.",
            labels=labels,
        )
        restarts = CounterMetricFamily(
            "mtp_proxy_backend_restarts",
            "Times the supervisor restarted the backend.",
            labels=labels,
        )
        crash_loops = CounterMetricFamily(
            "mtp_proxy_backend_crash_loops",
            "Times the backend was marked failed for crashing repeatedly.",
            labels=labels,
        )
        health_failures = CounterMetricFamily(
            "mtp_proxy_backend_health_check_failures",
            "Health checks the backend failed.",
            labels=labels,
        )
        supervised = self._supervised()
        for backend in self._state.backends.all():
            values = [backend.name, backend.model, backend.profile]
            in_flight.add_metric(values, backend.in_flight)
            ready.add_metric(values, 1.0 if backend.ready else 0.0)
            slots.add_metric(values, backend.slots)
            for each in BackendState:
                state.add_metric([*values, each.value], 1.0 if backend.state == each else 0.0)
            process = supervised.get(backend.name)
            restarts.add_metric(values, getattr(process, "restarts", 0))
            crash_loops.add_metric(values, getattr(process, "crash_loops", 0))
            health_failures.add_metric(values, getattr(process, "health_failures", 0))
        yield from (in_flight, state, ready, slots, restarts, crash_loops, health_failures)

    def _speculation_metric(self) -> Metric:
        family = InfoMetricFamily(
            "mtp_proxy_backend_speculation",
            "What each backend drafts with: its speculative type (llama-server's --spec-type: "
            "draft-mtp, draft-simple, ngram-mod, ...; none when it does not draft) and its draft "
            "model's file name (empty without one).",
            labels=["backend", "model", "profile"],
        )
        drafting = backend_speculation(self._state.settings, self._state.plans)
        for backend in self._state.backends.all():
            speculation = drafting.get(backend.name)
            if speculation is not None:
                family.add_metric(
                    [backend.name, backend.model, backend.profile],
                    {
                        "spec_type": speculation.spec_type,
                        "draft_model": speculation.draft_file or "",
                    },
                )
        return family

    def _draft_control_metric(self) -> Metric:
        family = GaugeMetricFamily(
            "mtp_proxy_backend_draft_control",
            "1 for what the draft-control probe found: per-request (it honours "
            "speculative.n_max), ignored (it does not, or the probe failed), undecided (it "
            "drafted nothing, so the probe cannot tell) or none (no speculation); all 0 until "
            "probed.",
            labels=["backend", "model", "control"],
        )
        for name, backend in self._supervised().items():
            found = getattr(backend, "draft_control", None)
            model = getattr(getattr(backend, "spec", None), "model", "")
            for control in get_args(DraftControl):
                family.add_metric([name, model, control], 1.0 if found == control else 0.0)
        return family

    def _busy_depth_metric(self) -> Metric:
        family = GaugeMetricFamily(
            "mtp_proxy_backend_busy_depth",
            "The draft depth a one-process backend runs every request admitted beside others "
            "at now: its busy epoch's (proxy/routing/busy.py). No series until it was first "
            "busy, nor for a one-slot process, which never is (mtp_proxy_backend_depth answers "
            "there).",
            labels=["backend", "model"],
        )
        backends = self._state.backends
        for epoch in busy_epochs(self._state.router).values():
            backend = backends.get(epoch.backend)
            if backend is not None and backend.slots <= 1:
                continue  # one slot: never anything beside it, so never busy
            family.add_metric([epoch.backend, epoch.model], epoch.depth)
        return family

    def _depth_now_metric(self) -> Metric:
        family = GaugeMetricFamily(
            "mtp_proxy_backend_depth",
            "The draft depth each backend runs now: of the request decoding on it (several at "
            "different depths: the deepest; source=decoding), else of the last request it "
            "served (source=last); a pool process runs its profile's (source=pool). Answers on "
            "a one-slot process too, which is never busy. No series before its first request.",
            labels=["backend", "model", "source"],
        )
        state, router = self._state, self._state.router
        depths = {
            m.name: {p.name: m.profile_depth(p) for p in m.profiles} for m in state.settings.models
        }
        for backend in state.backends.all():
            pool = None if backend.model in router.per_request else backend.profile
            now = depth_now(
                router.decoding(backend.name),
                depths.get(backend.model, {}),
                state.recent.last_of_backend.get(backend.name),
                pool,
            )
            if now is not None:
                family.add_metric([backend.name, backend.model, now.source], now.depth)
        return family

    def _late_system_metric(self) -> Metric:
        family = GaugeMetricFamily(
            "mtp_proxy_backend_late_system",
            "1 for what the chat-template check found a system message that is not first does: "
            "in-place, hoisted (moved to the front), refused (the proxy rewrites such messages "
            "under [compat] system_turns auto) or unknown; all 0 until checked.",
            labels=["backend", "model", "profile", "late_system"],
        )
        for name, backend in self._supervised().items():
            check = getattr(backend, "chat_template", None)
            found = getattr(check, "late_system", None)
            spec = getattr(backend, "spec", None)
            values = [name, getattr(spec, "model", ""), getattr(spec, "profile", "")]
            for late_system in get_args(LateSystem):
                family.add_metric([*values, late_system], 1.0 if found == late_system else 0.0)
        return family

    def _supervised(self) -> dict[str, object]:
        supervisor = self._state.supervisor
        return {b.spec.name: b for b in supervisor.backends} if supervisor else {}

    def _queue_metrics(self) -> Iterator[Metric]:
        queued = GaugeMetricFamily(
            "mtp_proxy_queued_requests",
            "Requests waiting for backend capacity, by model.",
            labels=["model"],
        )
        for model in self._state.models.primary_names():
            queued.add_metric([model], self._state.admission.queued(model))
        yield queued

    def _vllm_metrics(self) -> Iterator[Metric]:
        """The load under vLLM's names and label, so that a balancer or dashboard made for vLLM
        (the Gateway API Inference Extension scores backends by them) reads a proxy unchanged.
        No vllm:kv_cache_usage_perc: llama-server exports nothing it could be made from
        (docs/operations.md, "Several boxes")."""
        running = GaugeMetricFamily(
            "vllm:num_requests_running",
            "Requests being served by the model's backends (vLLM's name; the same count as "
            "mtp_proxy_backend_in_flight summed per model).",
            labels=["model_name"],
        )
        waiting = GaugeMetricFamily(
            "vllm:num_requests_waiting",
            "Requests waiting for a free slot of the model (vLLM's name; the same count as "
            "mtp_proxy_queued_requests).",
            labels=["model_name"],
        )
        for model in self._state.models.primary_names():
            running.add_metric([model], self._state.backends.slots_of(model)[1])
            waiting.add_metric([model], self._state.admission.queued(model))
        yield from (running, waiting)

    def _guard_metrics(self) -> Iterator[Metric]:
        """The start-up calibration and the acceptance-collapse guard of the processes serving
        per-request depths (proxy/routing/calibrate.py, proxy/routing/collapse.py)."""
        collapsed = GaugeMetricFamily(
            "mtp_proxy_acceptance_collapsed",
            "1 while a one-process backend's draft acceptance has collapsed (near 0, far below "
            "what its request classes had learned): it serves depth 0 and tries drafting again "
            "on a back-off schedule.",
            labels=["model", "backend"],
        )
        speed = GaugeMetricFamily(
            "mtp_proxy_calibration_speed_tokens_per_second",
            "Decode speed per request the start-up calibration measured, by draft depth and by "
            "load (requests decoding together).",
            labels=["model", "backend", "depth", "load"],
        )
        router = self._state.router
        for backend in self._state.backends.all():
            if backend.model not in router.per_request:
                continue
            guard = router.guards.get(backend.name)
            values = [backend.model, backend.name]
            collapsed.add_metric(values, 1.0 if guard is not None and guard.collapsed else 0.0)
            calibration = router.calibrated.get(backend.name)
            for cell in calibration.cells if calibration is not None else ():
                speed.add_metric([*values, str(cell.depth), str(cell.load)], cell.tok_s)
        yield from (collapsed, speed)

    def _learned_metrics(self) -> Iterator[Metric]:
        labels = ["model", "request_class", "load_level", "profile"]
        speed = GaugeMetricFamily(
            "mtp_proxy_learned_decode_tokens_per_second",
            "Learned decode speed per request class, load level (the requests decoding "
            "together it was measured at: 1, 2 for 2-3, 4 for 4+; any on a pool) and profile.",
            labels=labels,
        )
        acceptance = GaugeMetricFamily(
            "mtp_proxy_learned_acceptance_ratio",
            "Learned draft acceptance per request class and profile.",
            labels=labels,
        )
        samples = GaugeMetricFamily(
            "mtp_proxy_learned_samples",
            "Effective (decayed) sample count behind each learned estimate.",
            labels=labels,
        )
        for row in self._state.router.learned_rows():
            values = [row.model, row.request_class, row.load_level, row.profile]
            # No estimate yet (e.g. acceptance of a profile that never drafts): no series, not NaN.
            for family, value in ((speed, row.decode_tok_s), (acceptance, row.acceptance)):
                if not math.isnan(value):
                    family.add_metric(values, value)
            samples.add_metric(values, row.samples)
        yield from (speed, acceptance, samples)
