"""mtp-proxy: an OpenAI/Anthropic-compatible reverse proxy in front of llama.cpp's llama-server
that picks the speculative draft depth of each request.

The map: every module of the package, once, in the order the start-up or a request meets it
(tests/unit/test_map.py fails when a module is missing here or an entry is not a module). The
backend processes are the ``supervisor`` package's, which never imports this one.

Start-up (``mtp-proxy serve``) and the life of the process:
- ``cli.__main__``: ``python -m proxy.cli``, the same command.
- ``cli.main``: the command line: serve, check-config, status, init, tune, learned.
- ``config.settings``: the TOML file and MTP_PROXY_* overrides -> Settings (server, models, log).
- ``config.routing``: the ``[routing]`` section: the routing brain's thresholds and priors.
- ``config.side_requests``: the ``[side_requests]`` section: the rules and the kept slot.
- ``config.model_names``: the ``[model_names]`` section: names clients send -> models.
- ``config.reference``: every setting's reference, rendered from the schema (docs/configuration.md).
- ``config.__main__``: ``python -m proxy.config`` prints that reference.
- ``config.files``: the local files a user names, read bounded (no FIFO, device or huge file).
- ``config.overrides``: the service's environment (this shell's, the systemd unit's): the
  settings it overrides, where each was set, and the learned file in force.
- ``observability.logs``: structlog JSON lines (a console renderer on a tty), credentials redacted.
- ``plans.plan``: how each model is served (one process, pool, single) and its backend specs.
- ``plans.preflight``: whether the backends fit in GPU memory, said before they start.
- ``plans.speculation``: what each backend drafts with: its speculative type and draft model.
- ``plans.gguf``: what a GGUF says about itself (read bounded): trained context, MTP layers, KV
  shape.
- ``app``: the aiohttp application (routes, middlewares, cleanup contexts) and ``serve``.
- ``state``: ProxyState, the long-lived objects under one app key.
- ``serving.backends``: LiveBackends, the live view of every backend: readiness and load.
- ``plans.adopt``: the router, LiveBackends and the supervisor follow the plans.
- ``plans.auto``: auto's keep-or-fall-back once a backend's draft-control probe answered.
- ``lifecycle.sdnotify``: systemd's READY, RELOADING and STOPPING.
- ``cli.banner``: the start-up banner on a terminal: what runs, the URL, a request to try.
- ``lifecycle.fail_fast``: a model that never got a ready backend stops the start-up, with its
  cause.
- ``lifecycle.reload``: SIGHUP re-reads the configuration file and applies its models.
- ``lifecycle.learned_file``: the learned file as the proxy last read or wrote it; others' writes
  kept; its failed saves; whether the service's user can write it.
- ``lifecycle.drain``: graceful shutdown: the requests in flight finish before the backends stop.

A request, in the order it is served:
- ``apis``: the wire contract: which path is which API, error dialects, the depth key, 499.
- ``serving.connections``: client connections: a cap, a header deadline, half-closes.
- ``observability.access_log``: the request line of every request that no handler logs itself.
- ``serving.middlewares``: client keys, and errors in the called API's own shape.
- ``serving.handlers``: the generation handlers; models, health and metrics.
- ``serving.body``: reading the body: size limit, read deadline, framing errors, gzip.
- ``serving.body_items``: the body held to its item caps before it is parsed; large ones parsed
  off the loop.
- ``serving.model_names``: the model name a client sends -> the configured model.
- ``compat.request``: the mends of one request (``[compat]``): the bytes each backend gets.
- ``compat.outcome``: how a mend says it cannot (Unmendable) or must not (Refused) go ahead.
- ``compat.output_format``: Messages ``output_config.format``, which llama-server drops: a 400.
- ``compat.session_prefix``: Claude Code's per-session billing digits made constant.
- ``compat.tool_choice``: a chat tool_choice naming a function -> "required" of that function.
- ``compat.codex_tools``: Codex's ``additional_tools`` -> tools; its calls back as Codex's.
- ``compat.input_items``: Responses items without a type, reasoning items without content,
  item references.
- ``compat.text_format``: Responses ``text.format`` -> the ``response_format`` that is enforced.
- ``compat.system_turns``: late system messages for a template that refuses them, kept in place.
- ``compat.llama_errors``: llama-server's error answers, read (their ``error`` object).
- ``compat.template_refusal``: a chat template's refusal (a 500) relayed as the 400 it is.
- ``serving.exchange``: one generation: route, forward (retrying before the first byte), relay.
- ``routing.views``: what routing reads of a backend; ``serving.backends`` implements it.
- ``routing.router``: the routing brain's glue: a Route per request, its run, its Outcome.
- ``routing.features``: one pass over the body -> RequestFeatures (size, kind, session).
- ``routing.logprobs``: a request that asks for logprobs runs at depth 0.
- ``routing.classes``: a request class (context bucket x content kind), the unit of learning.
- ``routing.sessions``: which backend holds each session's prompt cache.
- ``routing.slot_caches``: which sessions' prompt caches each backend holds.
- ``routing.policy``: the pure decision for the pool shape (one process per profile).
- ``routing.depth``: the pure decision for one process: its replica and the request's depth.
- ``routing.choice``: the steps both policies share (estimates, cold roles, exploration).
- ``routing.load``: a process's recent admissions: the load and context they brought.
- ``routing.busy``: the busy epochs: the depth a busy process runs at, and their bookkeeping.
- ``routing.depth_clock``: how long a process ran busy at one depth only, per request.
- ``routing.calibration``: a backend's start-up calibration as data, and its cold rules.
- ``routing.calibrate``: the start-up calibration's requests, before a backend is ready.
- ``routing.collapse``: the acceptance-collapse guard (depth 0, drafting trials, back-off).
- ``routing.collapse_guards``: every backend's guard; a finished request's fate.
- ``serving.admission``: the per-model queue in front of the backends' slots.
- ``serving.depth_field``: the per-request depth spliced into the body.
- ``serving.side_requests``: an agent's side requests told from its turns, and the ``id_slot``
  that keeps them off the agent's slot.
- ``serving.depth_headers``: the depth and speculative type each answer carries.
- ``serving.forward``: forwarding to one backend and relaying its answer byte for byte.
- ``serving.responses_events``: /v1/responses stream events completed to the spec.
- ``serving.errors``: error bodies in OpenAI's or Anthropic's shape, mid-stream ones too.
- ``serving.expect``: the Expect header answered on every route, refusals in the API's shape.
- ``compat.overflow``: llama-server's context overflow -> each API's canonical error.
- ``routing.telemetry``: timings and usage read from the answer -> Observation.
- ``serving.spec_counters``: draft acceptance from /metrics for APIs without timings.
- ``routing.plausibility``: a backend's numbers checked before anything is learned from them.
- ``serving.dropped_numbers``: answers whose numbers were not learned: counted, logged once a
  minute per backend.
- ``routing.stats``: decayed statistics per (model, class, profile, load); the learned file.
- ``routing.priors``: the learned state's key (build, model file, type, box); exports, merged
  as priors.
- ``observability.bookkeeping``: what no client waits for (statistics, metrics, log lines), batched.
- ``observability.request_log``: a request's id and its logger.
- ``observability.metrics``: the proxy's Prometheus metrics.
- ``observability.recent``: the last finished requests and the depth chart, for the live page.
- ``observability.depth_now``: the depth a backend runs now (decoding, or its last request).
- ``serving.passthrough``: llama-server's other routes, forwarded or refused.

Beside the requests:
- ``observability.collectors``: metrics read at scrape time: backends, queues, what was learned.
- ``serving.admin``: the /admin endpoints: backends, restarting one, the routing table, the
  service, the live page's reads.
- ``serving.live``: those reads: the depth each process runs now and why, requests, the chart.
- ``serving.verdict``: does drafting pay: the start-up calibration per load level, the learned
  comparisons of the same load beside it.
- ``routing.now``: read-only: the busy epoch each process on per-request depths is in, its depth.
- ``ui.routes``: the live page at /ui/: its static files (proxy/ui/static), no data in them.
- ``plans.learned_keys``: what each model's learned state is valid for on this box.
- ``cli.learned``: ``mtp-proxy learned export`` and ``import``: one box's learning as others'
  priors.
- ``cli.status``: ``mtp-proxy status``: a running proxy's backends, depths and routing, as
  tables; ``--watch`` redraws them.

Setting up a box (``mtp-proxy check-config`` and ``mtp-proxy init``):
- ``cli.check_config``: ``check-config``: a configuration checked as the service will run it.
- ``config.sandbox``: the service unit's sandbox: the paths it hides or keeps read-only, and
  the drop-in that opens one (init warns, check-config refuses).
- ``plans.model_files``: the model files exist, can be read, and have the MTP layers drafted.
- ``plans.draft_models``: a draft model of the kind its speculative type needs, and of the
  model's vocabulary.
- ``plans.known_types``: the speculative types the configured llama-server lists in its --help.
- ``cli.init_config``: ``init``: a commented single-GPU configuration for one GGUF.
- ``cli.init_drafting``: which speculative type and depths init writes, and why.
- ``cli.builds``: the llama-server builds on this box, the patched one first.

``mtp-proxy tune``, measuring draft settings on this machine:
- ``tune.command``: the command line, and the run from start to end in either way.
- ``tune.plan.grid``: candidate draft settings: each type's default grid and the user's syntax.
- ``tune.run.service``: the running service: what it runs, its load, whether it runs.
- ``tune.run.guard``: refuses a second copy of the weights on the GPU the service uses.
- ``tune.plan.context``: the server's real context per slot and its tokenizer, read first.
- ``tune.plan.workload``: what is replayed, sized to that context; what does not fit, and why.
- ``workloads.trace``: the trace file format (JSON lines), shared with ``bench.routing``.
- ``workloads.texts``: the text builders of the workloads: code, prose, agent turns.
- ``tune.run.job``: a run's shared steps: workload, store, plan, recorder.
- ``tune.plan.outline``: the plan printed before anything is measured, and its estimate.
- ``tune.plan.estimate``: the warm-up that measures this backend's speed for the estimate.
- ``tune.run.own_job``: a run on tune's own processes (the service stopped).
- ``tune.run.own_run``: replays the workload under each setting, one process at a time.
- ``tune.run.launch``: one backend process for one setting, run by the supervisor's Child.
- ``tune.run.service_job``: a run through the running service, and its reload after --apply.
- ``tune.run.service_run``: replays the workload through the service, pinned, depth per request.
- ``tune.measure.record``: one request from sending to the store: measured, failed, or given up.
- ``tune.measure.reading``: one measured request, read as the router reads an answer.
- ``tune.measure.failures``: failures per class and reason; classes given up after their first
  repeat.
- ``tune.measure.store``: measured results on disk, so a rerun resumes.
- ``tune.run.progress``: the bar and the time left, corrected as the run goes.
- ``tune.report.analysis``: measurements -> median and spread per setting, class and load level.
- ``tune.report.recommend``: the fewest settings that capture the gain, as profiles named by
  setting.
- ``tune.report.labels``: request classes in words, and in file names.
- ``tune.report.summary``: the end of a run: the outputs, the gaps, the exit code.
- ``tune.report.outputs``: the table (text, CSV, JSON), profiles.toml and the learned file.
- ``tune.report.chart``: one PNG per request class and a summary, readable alone.
- ``tune.report.apply``: --apply: the config, the learned file in force, the reload.
"""
