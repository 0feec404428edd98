"""The routing brain: which profile (draft depth) and backend serve a request; what was learned.

Pure but for ``router`` (the state) and ``spec_counters`` (a /metrics read). In request order:
- ``router``: the state around the policies (sessions, mix, busy epochs) and the app's glue.
- ``features``: one pass over a request body -> RequestFeatures (size, content kind, session).
- ``classes``: a request class (context bucket x content kind), shared by everything below.
- ``policy``: the decision for the pool: features + backend snapshot + statistics -> Decision.
- ``depth``: the decision for one process: a replica and the request's depth -> DepthDecision.
- ``choice``: the steps both policies share: borrowed estimates, cold roles, exploration.
- ``busy``: the depth a busy process runs at, learned from what it achieved at each depth.
- ``slot_caches``: which sessions' prompt caches each backend holds (llama-server's slots).
- ``telemetry``: timings and usage read from an answer (stream or body) -> Observation.
- ``spec_counters``: draft acceptance from a backend's /metrics, for APIs without timings.
- ``stats``: decayed statistics per (model, class, profile, load level); the state file.
- ``now``: read-only, for the live page and the metrics: the busy epoch each process is in.

The settings: the ``[routing]`` section, RoutingSettings in ``proxy.config.routing``.
"""
