"""mtp-proxy: an OpenAI/Anthropic-compatible reverse proxy in front of llama.cpp's llama-server
that picks the speculative draft depth of each request.

The map: every module of the package, once, in the order the start-up or a request meets it
(tests/unit/test_map.py fails when a module is missing here or an entry is not a module). The
backend processes are the ``supervisor`` package's, which never imports this one.

Start-up (``mtp-proxy serve``) and the life of the process:
- ``cli``: the command line: serve, check-config, status, tune.
- ``config.settings``: the TOML file and MTP_PROXY_* overrides -> Settings (server, models, log).
- ``config.routing``: the ``[routing]`` section: the routing brain's thresholds and priors.
- ``config.model_names``: the ``[model_names]`` section: names clients send -> models.
- ``config.reference``: every setting's reference, rendered from the schema (docs/configuration.md).
- ``config.__main__``: ``python -m proxy.config`` prints that reference.
- ``config.files``: the local files a user names, read bounded (no FIFO, device or huge file).
- ``ops.logs``: structlog JSON lines (a console renderer on a tty), credentials redacted.
- ``plans.plan``: how each model is served (one process, pool, single) and its backend specs.
- ``plans.preflight``: whether the backends fit in GPU memory, said before they start.
- ``app``: the aiohttp application (routes, middlewares, cleanup contexts) and ``serve``.
- ``state``: ProxyState, the long-lived objects under one app key.
- ``serving.backends``: LiveBackends, the live view of every backend: readiness and load.
- ``plans.adopt``: the router, LiveBackends and the supervisor follow the plans.
- ``plans.auto``: auto's keep-or-fall-back once a backend's draft-control probe answered.
- ``ops.sdnotify``: systemd's READY, RELOADING and STOPPING.
- ``ops.reload``: SIGHUP re-reads the configuration file and applies its models.
- ``ops.drain``: graceful shutdown: the requests in flight finish before the backends stop.

A request, in the order it is served:
- ``apis``: the wire contract: which path is which API, error dialects, the depth key, 499.
- ``serving.connections``: client connections: a cap, a header deadline, half-closes.
- ``ops.access_log``: the request line of every request that no handler logs itself.
- ``serving.middlewares``: client keys, and errors in the called API's own shape.
- ``serving.handlers``: the generation handlers; models, health and metrics.
- ``serving.body``: reading the body: size limit, read deadline, framing errors, gzip.
- ``serving.model_names``: the model name a client sends -> the configured model.
- ``serving.exchange``: one generation: route, forward (retrying before the first byte), relay.
- ``routing.router``: the routing brain's state and glue: a backend and depth per request.
- ``routing.features``: one pass over the body -> RequestFeatures (size, kind, session).
- ``routing.classes``: a request class (context bucket x content kind), the unit of learning.
- ``routing.policy``: the pure decision for the pool shape (one process per profile).
- ``routing.depth``: the pure decision for one process: its replica and the request's depth.
- ``routing.choice``: the steps both policies share (estimates, cold roles, exploration).
- ``routing.busy``: the depth a busy process runs at, learned per depth while busy.
- ``routing.slot_caches``: which sessions' prompt caches each backend holds.
- ``serving.admission``: the per-model queue in front of the backends' slots.
- ``serving.depth_field``: the per-request depth spliced into the body.
- ``serving.forward``: forwarding to one backend and relaying its answer byte for byte.
- ``serving.responses_events``: /v1/responses stream events completed to the spec.
- ``serving.errors``: error bodies in OpenAI's or Anthropic's shape, mid-stream ones too.
- ``routing.telemetry``: timings and usage read from the answer -> Observation.
- ``routing.spec_counters``: draft acceptance from /metrics for APIs without timings.
- ``routing.stats``: decayed statistics per (model, class, profile, load); the state file.
- ``ops.bookkeeping``: what no client waits for (statistics, metrics, log lines), batched.
- ``ops.request_log``: a request's id and its logger.
- ``ops.metrics``: the proxy's Prometheus metrics.
- ``serving.passthrough``: llama-server's other routes, forwarded or refused.

Beside the requests:
- ``ops.collectors``: metrics read at scrape time: backends, queues, what was learned.
- ``ops.admin``: the /admin endpoints: backends, restarting one, the routing table.
- ``ops.status``: ``mtp-proxy status``: a running proxy's backends and routing, as tables.

``mtp-proxy tune``, measuring draft settings on this machine:
- ``tune.command``: the command line and the run from start to end.
- ``tune.grid``: candidate draft settings: the default grid and the user's syntax.
- ``tune.workload``: what is replayed: the built-in workload or a trace file.
- ``tune.trace``: the trace file format (JSON lines), shared with ``bench.routing``.
- ``tune.texts``: the text builders of the workloads: code, prose, agent turns.
- ``tune.runner``: replays the workload under each setting, one process at a time.
- ``tune.launch``: one backend process for one setting, run by the supervisor's Child.
- ``tune.measure``: one measured request, read as the router reads an answer.
- ``tune.store``: measured results on disk, so a rerun resumes.
- ``tune.progress``: the estimate before the run, and its progress.
- ``tune.analysis``: measurements -> median and spread per setting and request class.
- ``tune.recommend``: the fewest settings that capture the gain, as profiles.
- ``tune.outputs``: the table (text, CSV, JSON), profiles.toml and the state file.
- ``tune.chart``: one PNG per request class.
"""
