"""The routing brain: which draft depth (profile) and backend serve a request, and what was learned.

- ``features``: one pass over a request body -> RequestFeatures (size, content kind, session).
- ``classes``: a request class (context bucket x content kind), shared by everything below.
- ``telemetry``: timings and usage read from responses -> Observation.
- ``stats``: decayed statistics per (model, class, profile), per load level on one process.
- ``policy``: pure decision for a pool: features + backend snapshot + statistics -> Decision.
- ``depth``: pure decision for one process: replica and per-request draft depth, from what is
  decoding there -> DepthDecision.
- ``router``: the state around the policies (sessions, mix) and the glue to the app.
- ``slot_caches``: which sessions' prompt caches each backend holds (llama-server's slots).
- ``settings``: the ``[routing]`` section of the configuration.
"""
