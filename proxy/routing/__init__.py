"""The routing brain: which profile (draft depth) and backend serve a request; what was learned.

It imports nothing of the serving layer: it reads backends through its own views and hands back
decisions as data (``design.md`` beside this file: the concerns, their types, where they live).
Pure but for ``router`` (the state around the policies) and ``calibrate`` (a few requests to a
backend before it is ready). In request order:
- ``views``: what routing reads of a backend (BackendView) and of the set of them (Backends).
- ``router``: the glue: a Route per request, its run, its Outcome learned from.
- ``logprobs``: a request that asks for logprobs runs at depth 0 (llama-server's drafted tokens
  read 0.0).
- ``features``: one pass over a request body -> RequestFeatures (size, content kind, session).
- ``classes``: a request class (context bucket x content kind), shared by everything below.
- ``sessions``: which backend holds each session's prompt cache.
- ``slot_caches``: which sessions' prompt caches each backend holds (llama-server's slots).
- ``policy``: the decision for the pool: features + backend snapshot + statistics -> Decision.
- ``depth``: the decision for one process: a replica and the request's depth -> DepthDecision.
- ``choice``: the steps both policies share: borrowed estimates, cold roles, exploration.
- ``load``: a process's recent admissions: the load and the context they brought.
- ``busy``: the busy epochs: the depth a busy process runs at, and their bookkeeping.
- ``depth_clock``: how long a process ran busy at one depth only, per request (DepthRecord).
- ``calibration``: a backend's start-up calibration as data, and the cold rule it implies.
- ``calibrate``: the start-up calibration's measurement over HTTP, before a backend is ready.
- ``collapse``: the acceptance-collapse guard of one backend (serve depth 0, trials, back-off).
- ``collapse_guards``: every backend's guard, and a finished request's fate (learn, hold, skip).
- ``telemetry``: timings and usage read from an answer (stream or body) -> Observation.
- ``plausibility``: an Observation's numbers checked before anything is learned from them.
- ``stats``: decayed statistics per (model, class, profile, load level); the learned file.
- ``priors``: what the learned state was learned on (its key), and exports merged as priors.
- ``now``: read-only, for the live page and the metrics: the busy epoch each process is in.

The settings: the ``[routing]`` section, RoutingSettings in ``proxy.config.routing``.
"""
