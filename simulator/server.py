"""aiohttp application speaking llama-server's HTTP API, and serve() to run it."""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Awaitable, Callable
from typing import Any

import structlog
from aiohttp import web

from simulator.config import SimConfig, parse_acceptance_scale
from simulator.depth import requested_depth
from simulator.engine import ContextTooLong, Engine, Job
from simulator.formats import Api, Response
from simulator.info import detokenize, health, metrics, models, props, slots, tokenize
from simulator.model import OFF, DraftSettings
from simulator.presets import Preset
from simulator.prompts import (
    BadRequest,
    Prompt,
    chat_prompt,
    completion_prompt,
    infill_prompt,
    messages_prompt,
    responses_prompt,
)
from simulator.structured import completions_wanted, forced_output, top_logprobs_wanted
from simulator.template import (
    TemplateRefused,
    Turn,
    chat_turns,
    check_template,
    messages_turns,
    responses_turns,
)
from simulator.webcommon import ENGINE, READY_AT, dumps, error_response, json_body, model_name

log = structlog.get_logger("simulator")
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
KEEPALIVE_S = 5.0  # llama-server (cpp-httplib) closes a keep-alive connection idle this long


_PARSERS: dict[Api, Callable[[dict[str, Any]], Prompt]] = {
    Api.CHAT: chat_prompt,
    Api.COMPLETION: completion_prompt,
    Api.RESPONSES: responses_prompt,
    Api.MESSAGES: messages_prompt,
    Api.NATIVE: completion_prompt,
}
# The turns each API's body hands to the chat template (simulator/template.py), and the key that
# holds them; /v1/completions and /completion take a raw prompt: no template.
_TURNS: dict[Api, tuple[str, Callable[[dict[str, Any]], list[Turn]]]] = {
    Api.CHAT: ("messages", chat_turns),
    Api.RESPONSES: ("input", responses_turns),
    Api.MESSAGES: ("messages", messages_turns),
}
_MAX_TOKENS_KEYS: dict[Api, tuple[str, ...]] = {
    Api.CHAT: ("n_predict", "max_completion_tokens", "max_tokens"),
    Api.COMPLETION: ("n_predict", "max_tokens"),
    Api.RESPONSES: ("n_predict", "max_output_tokens"),
    Api.MESSAGES: ("n_predict", "max_tokens"),
    Api.NATIVE: ("n_predict", "max_tokens"),
}


@web.middleware
async def _guard(request: web.Request, handler: Handler) -> web.StreamResponse:
    """503 while "loading the model"; API-shaped errors instead of aiohttp's HTML pages."""
    if asyncio.get_running_loop().time() < request.app[READY_AT]:
        return error_response(503, "Loading model", "unavailable_error")
    try:
        return await handler(request)
    except (BadRequest, TemplateRefused, ContextTooLong) as exc:
        return _refused(exc)
    except web.HTTPNotFound:
        return error_response(404, "File Not Found", "not_found_error")
    except web.HTTPMethodNotAllowed:
        return error_response(405, "Method Not Allowed", "invalid_request_error")


def _refused(exc: BadRequest | TemplateRefused | ContextTooLong) -> web.Response:
    """llama-server's answer to a request it cannot serve."""
    if isinstance(exc, TemplateRefused):  # a Jinja exception: llama-server says 500
        return error_response(500, str(exc), "server_error")
    if isinstance(exc, ContextTooLong):
        return error_response(
            400,
            str(exc),
            "exceed_context_size_error",
            n_prompt_tokens=exc.n_prompt,
            n_ctx=exc.n_ctx,
        )
    return error_response(400, str(exc), "invalid_request_error")


def _prompt(
    engine: Engine,
    api: Api,
    body: dict[str, Any],
    parse: Callable[[dict[str, Any]], Prompt] | None = None,
) -> Prompt:
    """The body's prompt: converted (a 400 if it cannot be; ``parse`` instead of the API's own
    parser, as /infill's), then templated (a 500 where the template refuses, as llama-server's
    Jinja errors). llama-server's converters pass an empty list of messages on to the template,
    which refuses it: that 500 comes where the simulator's converter would say 400."""
    templated = _TURNS.get(api) if engine.refuses_late_system else None
    if templated is not None and body.get(templated[0]) == []:
        check_template(templated[1](body))  # no messages, or a system prompt alone
    prompt = (parse or _PARSERS[api])(body)
    if templated is not None:
        check_template(templated[1](body))
    return prompt


def _max_tokens(body: dict[str, Any], api: Api) -> int | None:
    for key in _MAX_TOKENS_KEYS[api]:
        value = body.get(key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int):
            raise BadRequest(f"'{key}' must be an integer")
        return value
    return None


# --- generation ---------------------------------------------------------------------------------


async def _complete(
    api: Api, request: web.Request, parse: Callable[[dict[str, Any]], Prompt] | None = None
) -> web.StreamResponse:
    engine = request.app[ENGINE]
    body = await json_body(request)
    several = completions_wanted(body, api, engine.config.n_parallel)
    logprobs = top_logprobs_wanted(body, api)
    forced = forced_output(body, api)  # an answer response_format or tool_choice fixes
    prompt = _prompt(engine, api, body, parse)
    depth = requested_depth(body) if engine.config.request_draft else None
    limit, ignore_eos = _max_tokens(body, api), bool(body.get("ignore_eos"))
    answer, tool = (None, None) if forced is None else (forced.text, forced.tool)
    model = body.get("model")
    name = model if isinstance(model, str) and model else model_name(engine)
    responses = [
        Response(
            api,
            name,
            engine.job(prompt, limit, ignore_eos, depth, answer),
            body,
            logprobs=logprobs,
            tool=tool,
        )
        for _ in range(several)  # one slot each, as llama-server's n_cmpl
    ]
    if not body.get("stream"):
        return web.json_response(await _whole(engine, responses), dumps=dumps)
    return await _streamed(request, engine, responses[0])


async def _whole(engine: Engine, responses: list[Response]) -> dict[str, Any]:
    """The complete answer; several completions as choices 0, 1, ... of the first's body."""

    async def run(job: Job) -> None:
        async with contextlib.aclosing(engine.run(job)) as steps:
            async for _ in steps:
                pass

    await asyncio.gather(*(run(r.job) for r in responses))
    bodies = [r.body(r.job.text(0, r.job.produced)) for r in responses]
    if len(bodies) > 1:
        choices = [{**b["choices"][0], "index": i} for i, b in enumerate(bodies)]
        bodies[0]["choices"] = choices
    return bodies[0]


async def _streamed(request: web.Request, engine: Engine, resp: Response) -> web.StreamResponse:
    job = resp.job
    out = web.StreamResponse(
        headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
    )
    await out.prepare(request)
    quoted, n, sent = job.passage.quoted, len(job.passage.quoted), 0
    try:
        async with contextlib.aclosing(engine.run(job)) as steps:
            async for new in steps:
                first = job.start + sent
                await out.write(resp.tokens([quoted[(first + i) % n] for i in range(new)], sent))
                sent += new
        await out.write(resp.finish(job.text(0, job.produced)))
        await out.write_eof()
    except ConnectionResetError:
        pass  # the client left: the slot was freed when the step iterator closed
    return out


async def chat_completions(request: web.Request) -> web.StreamResponse:
    return await _complete(Api.CHAT, request)


async def completions(request: web.Request) -> web.StreamResponse:
    return await _complete(Api.COMPLETION, request)


async def native_completion(request: web.Request) -> web.StreamResponse:
    return await _complete(Api.NATIVE, request)


async def infill(request: web.Request) -> web.StreamResponse:
    """llama-server's /infill: a completion of prefix + prompt + suffix, /completion's answer."""
    return await _complete(Api.NATIVE, request, infill_prompt)


async def responses(request: web.Request) -> web.StreamResponse:
    return await _complete(Api.RESPONSES, request)


async def messages(request: web.Request) -> web.StreamResponse:
    return await _complete(Api.MESSAGES, request)


async def _count_tokens(api: Api, request: web.Request) -> web.Response:
    """llama-server's token counting (handle_count_tokens): the prompt the request would make."""
    engine = request.app[ENGINE]
    prompt = _prompt(engine, api, await json_body(request))
    payload: dict[str, Any] = {"input_tokens": len(engine.tokenizer.encode(prompt.text))}
    if api is not Api.MESSAGES:
        payload["object"] = "response.input_tokens"
    return web.json_response(payload)


def _counter(api: Api) -> Callable[[web.Request], Awaitable[web.Response]]:
    async def count(request: web.Request) -> web.Response:
        return await _count_tokens(api, request)

    return count


async def apply_template(request: web.Request) -> web.Response:
    prompt = _prompt(request.app[ENGINE], Api.CHAT, await json_body(request))
    return web.json_response({"prompt": prompt.text}, dumps=dumps)


def _draft_from(value: Any, default: DraftSettings) -> DraftSettings:
    if value is None:
        return default
    if value in ("off", "none", False):
        return OFF
    if not isinstance(value, dict):
        raise BadRequest("'draft' must be an object, \"off\" or null")
    try:
        return DraftSettings(
            spec_type=str(value.get("spec_type", "draft-mtp")),
            n_max=int(value.get("n_max", default.n_max if default.enabled else 16)),
            n_min=int(value.get("n_min", 0)),
            p_min=float(value.get("p_min", 0.75)),
        )
    except (TypeError, ValueError) as exc:
        raise BadRequest(f"bad 'draft': {exc}") from exc


async def sim_predict(request: web.Request) -> web.Response:
    """The routing oracle: expected figures of a request here, given this server's cache state.

    Body: the request as the proxy would send it, plus optional "api" (chat | completion |
    responses | messages; guessed from the keys otherwise), "draft" (settings to evaluate
    instead of this server's own, or "off") and "concurrent" (decoding requests incl. this one).
    """
    engine = request.app[ENGINE]
    body = await json_body(request)
    api_name = body.get("api")
    if api_name is None:
        api_name = "responses" if "input" in body else "completion" if "prompt" in body else "chat"
    try:
        api = Api(api_name)
    except ValueError as exc:
        raise BadRequest(f"unknown api {api_name!r}") from exc
    concurrent = body.get("concurrent")
    if concurrent is not None and not isinstance(concurrent, int):
        raise BadRequest("'concurrent' must be an integer")
    result = engine.predict(
        _PARSERS[api](body),
        _max_tokens(body, api),
        bool(body.get("ignore_eos")),
        _draft_from(body.get("draft"), engine.draft),
        concurrent,
        requested_depth(body) if engine.config.request_draft else None,
    )
    return web.json_response(result)


async def sim_acceptance_scale(request: web.Request) -> web.Response:
    """A fault mode: change --acceptance-scale at run time (``{"acceptance_scale": "0.01"}``
    collapses every request's acceptance to the preset's minimum, ``"code=0.5"`` halves code's,
    ``""`` restores normal drafting). Requests admitted afterwards draft with it. Answer: the
    scales now in force."""
    engine = request.app[ENGINE]
    body = await json_body(request)
    spec = body.get("acceptance_scale")
    if not isinstance(spec, str):
        raise BadRequest('\'acceptance_scale\' must be a string such as "0.01" or "code=0.5"')
    try:
        engine.acceptance_scale = parse_acceptance_scale(spec)
    except ValueError as exc:
        raise BadRequest(f"acceptance_scale: {exc}") from None
    log.info("sim: acceptance scale changed", acceptance_scale=engine.acceptance_scale)
    return web.json_response({"acceptance_scale": engine.acceptance_scale})


async def sim_drop(request: web.Request) -> web.Response:
    """A fault mode: the next ``requests`` generation requests are read, then their connection
    is dropped before any answer (``{"requests": 1}``), while /health answers as ever: a request
    lost on a keep-alive connection the server closed as it was sent, on a process that is
    healthy. Answer: how many are still to drop."""
    engine = request.app[ENGINE]
    body = await json_body(request)
    count = body.get("requests")
    if isinstance(count, bool) or not isinstance(count, int) or count < 0:
        raise BadRequest("'requests' must be a non-negative integer")
    engine.drop_next = count
    log.info("sim: dropping the next requests", requests=count)
    return web.json_response({"requests": engine.drop_next})


def _droppable(handler: Handler) -> Handler:
    """A generation route, under POST /sim/drop's fault: while requests are still to drop, each
    is read, then its connection closed before any answer."""

    async def generation(request: web.Request) -> web.StreamResponse:
        engine = request.app[ENGINE]
        if engine.drop_next <= 0:
            return await handler(request)
        engine.drop_next -= 1
        await request.read()
        if request.transport is not None:
            request.transport.abort()
        return web.Response(status=500)  # never sent: the connection is gone

    return generation


def create_app(config: SimConfig, preset: Preset) -> web.Application:
    app = web.Application(middlewares=[_guard], client_max_size=64 * 1024 * 1024)
    app[ENGINE] = Engine(config, preset)
    app[READY_AT] = 0.0

    async def _loading(app: web.Application) -> None:
        app[READY_AT] = asyncio.get_running_loop().time() + config.load_time

    app.on_startup.append(_loading)
    r = app.router
    for path in ("/health", "/v1/health"):
        r.add_get(path, health)
    for path in ("/v1/models", "/models"):
        r.add_get(path, models)
    r.add_get("/props", props)
    r.add_get("/slots", slots)
    r.add_get("/metrics", metrics)
    r.add_post("/tokenize", tokenize)
    r.add_post("/detokenize", detokenize)
    for path in ("/v1/chat/completions", "/chat/completions"):
        r.add_post(path, _droppable(chat_completions))
    for path in ("/v1/completions", "/completions"):
        r.add_post(path, _droppable(completions))
    r.add_post("/completion", _droppable(native_completion))
    r.add_post("/infill", _droppable(infill))
    for path in ("/v1/responses", "/responses"):
        r.add_post(path, _droppable(responses))
    r.add_post("/v1/messages", _droppable(messages))
    r.add_post("/apply-template", apply_template)
    for path, api in (
        ("/v1/messages/count_tokens", Api.MESSAGES),
        ("/v1/responses/input_tokens", Api.RESPONSES),
        ("/responses/input_tokens", Api.RESPONSES),
        ("/v1/chat/completions/input_tokens", Api.CHAT),
        ("/chat/completions/input_tokens", Api.CHAT),
    ):
        r.add_post(path, _counter(api))
    r.add_post("/sim/predict", sim_predict)
    r.add_post("/sim/acceptance-scale", sim_acceptance_scale)
    r.add_post("/sim/drop", sim_drop)
    return app


async def serve(
    config: SimConfig, preset: Preset, *, shutdown_trigger: asyncio.Event | None = None
) -> None:
    """Run until SIGTERM/SIGINT (or shutdown_trigger), then stop cleanly."""
    stop = shutdown_trigger or asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)
    # handler_cancellation: a client that disconnects cancels its handler at once, so its slot
    # is released even while the request is only sleeping through prefill or a step.
    runner = web.AppRunner(
        create_app(config, preset),
        handler_cancellation=True,
        keepalive_timeout=KEEPALIVE_S,
        access_log=None,
        shutdown_timeout=1.0,
    )
    await runner.setup()
    try:
        site = web.TCPSite(runner, config.host, config.port)
        await site.start()
        port = runner.addresses[0][1] if runner.addresses else config.port
        log.info(
            f"main: server is listening on http://{config.host}:{port} - starting the main loop",
            port=port,
            preset=preset.name,
            draft=config.draft.spec_type if config.draft.enabled else "none",
        )
        await stop.wait()
        log.info("main: shutting down")
    finally:
        await runner.cleanup()
