"""The per-request draft depth ("speculative.n_max") on the real simulator process, over HTTP.

The contract (patches/llama.cpp/README.md): a flat top-level integer key on chat, completions,
/completion, responses and messages; 0 = no drafting, above the start-up depth clamped, negative or
non-integer a 400 (the schema's message), a nested {"speculative": {...}} ignored; with
--ignore-request-draft the key has no effect at all, as on stock llama-server.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator
from typing import Any

import aiohttp
import pytest

from tests.support.simulator_process import MAX3, Sim, metric_values, post, simulator, sse

# n_min 3 forces every step to draft min(3, depth) tokens, so the exact count can be checked:
# draft tokens = depth x drafting steps, from the /metrics counters around one request.
FORCED = [*MAX3, "--spec-draft-n-min", "3"]
LIMIT_MESSAGE = "Value must be between 0 <= value <= 2147483647"
PROMPT = "Hi there! How are you today?"


@pytest.fixture(scope="module")
def forced_sim() -> Iterator[Sim]:
    with simulator("--preset", "fast", "--metrics", "-np", "1", *FORCED) as sim:
        yield sim


@pytest.fixture(scope="module")
def stock_sim() -> Iterator[Sim]:
    with simulator("--preset", "fast", "--metrics", *FORCED, "--ignore-request-draft") as sim:
        yield sim


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


# (path, body without the depth field, stream): one request of 30 tokens per API.
APIS: dict[str, tuple[str, dict[str, Any], bool]] = {
    "chat": (
        "/v1/chat/completions",
        {"messages": [{"role": "user", "content": PROMPT}], "max_tokens": 30},
        False,
    ),
    "completions": ("/v1/completions", {"prompt": PROMPT, "max_tokens": 30}, False),
    "native": ("/completion", {"prompt": PROMPT, "n_predict": 30}, False),
    "responses": ("/v1/responses", {"input": PROMPT, "max_output_tokens": 30}, True),
    "messages": (
        "/v1/messages",
        {"messages": [{"role": "user", "content": PROMPT}], "max_tokens": 30},
        False,
    ),
}


async def counters(http: aiohttp.ClientSession, sim: Sim) -> tuple[float, float]:
    """(draft tokens, drafting steps) so far, from llama-server's /metrics counters."""
    async with http.get(sim.url + "/metrics") as r:
        values = metric_values(await r.text())
    return (
        values["llamacpp:spec_decode_num_draft_tokens_total"],
        values["llamacpp:spec_decode_num_drafts_total"],
    )


async def timings(
    http: aiohttp.ClientSession, sim: Sim, api: str, extra: dict[str, Any]
) -> dict[str, Any] | None:
    """Send one request; its timings (None where the API carries none: messages)."""
    path, body, stream = APIS[api]
    if stream:
        events = await sse(http, sim.url + path, {**body, **extra, "stream": True})
        return dict(json.loads(events[-1][1])["timings"])
    status, out = await post(http, sim.url + path, {**body, **extra})
    assert status == 200, out
    return dict(out["timings"]) if "timings" in out else None


async def drafted(
    http: aiohttp.ClientSession, sim: Sim, api: str, extra: dict[str, Any]
) -> tuple[int, int, dict[str, Any] | None]:
    """(draft tokens, drafting steps, timings) of one request."""
    tokens_before, steps_before = await counters(http, sim)
    t = await timings(http, sim, api, extra)
    tokens_after, steps_after = await counters(http, sim)
    return int(tokens_after - tokens_before), int(steps_after - steps_before), t


@pytest.mark.parametrize("api", list(APIS))
async def test_each_api_drafts_exactly_the_requested_depth(
    http: aiohttp.ClientSession, forced_sim: Sim, api: str
) -> None:
    for depth, expected in ((0, 0), (1, 1), (2, 2), (3, 3), (8, 3), (None, 3)):
        extra = {} if depth is None else {"speculative.n_max": depth}
        tokens, steps, t = await drafted(http, forced_sim, api, extra)
        assert tokens == expected * steps, (api, depth, tokens, steps)
        if expected == 0:
            assert steps == 0  # no drafting step counted at all
        else:
            assert steps > 0
        if t is not None:  # draft_n absent when nothing was drafted, as llama-server
            assert t.get("draft_n") == (tokens or None), (api, depth, t)
            assert t["predicted_n"] == 30


@pytest.mark.parametrize("api", list(APIS))
async def test_a_bad_depth_is_a_400_with_the_schema_message(
    http: aiohttp.ClientSession, forced_sim: Sim, api: str
) -> None:
    path, body, _ = APIS[api]
    for value in (-1, 2**31):
        status, out = await post(http, forced_sim.url + path, {**body, "speculative.n_max": value})
        assert status == 400
        assert out["error"]["code"] == 400 and out["error"]["type"] == "invalid_request_error"
        assert LIMIT_MESSAGE in out["error"]["message"]
        assert f"but got {value}" in out["error"]["message"]
    for value in (2.5, "3", True, [3], {"n": 3}):
        status, out = await post(http, forced_sim.url + path, {**body, "speculative.n_max": value})
        assert status == 400, value
        assert "speculative.n_max" in out["error"]["message"]
        assert out["error"]["type"] == "invalid_request_error"


async def test_null_integral_float_and_nested_form(
    http: aiohttp.ClientSession, forced_sim: Sim
) -> None:
    # null is the server default (the schema treats it as absent); 2.0 is the integer 2
    tokens, steps, _ = await drafted(http, forced_sim, "chat", {"speculative.n_max": None})
    assert tokens == 3 * steps > 0
    tokens, steps, _ = await drafted(http, forced_sim, "chat", {"speculative.n_max": 2.0})
    assert tokens == 2 * steps > 0
    # the nested form is not the key: ignored, the request drafts at the start-up depth
    tokens, steps, t = await drafted(http, forced_sim, "chat", {"speculative": {"n_max": 0}})
    assert tokens == 3 * steps > 0 and t is not None and t["draft_n"] == tokens


@pytest.mark.parametrize("api", list(APIS))
async def test_ignore_request_draft_behaves_like_stock(
    http: aiohttp.ClientSession, stock_sim: Sim, api: str
) -> None:
    for value in (0, 1, -1, "x"):
        tokens, steps, t = await drafted(http, stock_sim, api, {"speculative.n_max": value})
        assert tokens == 3 * steps > 0, (api, value)  # the start-up depth, 200 even for -1
        if t is not None:
            assert t["draft_n"] == tokens


async def test_depth_0_leaves_the_per_position_counters_alone(
    http: aiohttp.ClientSession, forced_sim: Sim
) -> None:
    async with http.get(forced_sim.url + "/metrics") as r:
        before = metric_values(await r.text())
    await timings(http, forced_sim, "chat", {"speculative.n_max": 0})
    async with http.get(forced_sim.url + "/metrics") as r:
        after = metric_values(await r.text())
    for name in (
        "llamacpp:spec_decode_num_draft_tokens_total",
        "llamacpp:spec_decode_num_accepted_tokens_total",
        "llamacpp:spec_decode_num_drafts_total",
    ):
        assert after[name] == before.get(name, 0.0)
    predicted = "llamacpp:tokens_predicted_total"
    assert after[predicted] == before[predicted] + 30


# --- speed and acceptance follow the requested depth through the same model ----------------------

GREETING = {
    "messages": [{"role": "user", "content": PROMPT}],
    "max_tokens": 128,
    "ignore_eos": True,
}
SETUP_B = ("--preset", "setup-b", "--time-scale", "400", "--latent-sigma", "0", "--seed", "5")


async def mean_speed(
    http: aiohttp.ClientSession, sim: Sim, extra: dict[str, Any], n: int = 8
) -> tuple[float, float]:
    """Mean predicted_per_second and pooled acceptance of n greetings."""
    speeds, drafted_n, accepted_n = [], 0, 0
    for _ in range(n):
        status, out = await post(http, sim.url + "/v1/chat/completions", {**GREETING, **extra})
        assert status == 200
        t = out["timings"]
        speeds.append(t["predicted_per_second"])
        drafted_n += t.get("draft_n", 0)
        accepted_n += t.get("draft_n_accepted", 0)
    return sum(speeds) / n, accepted_n / drafted_n if drafted_n else 0.0


async def test_a_shallower_request_behaves_like_a_process_at_that_depth(
    http: aiohttp.ClientSession,
) -> None:
    depth2 = ["--spec-type", "draft-mtp", "--spec-draft-n-max", "2"]
    with simulator(*SETUP_B, *MAX3) as deep, simulator(*SETUP_B, *depth2) as two:
        requested, requested_acc = await mean_speed(http, deep, {"speculative.n_max": 2})
        started, started_acc = await mean_speed(http, two, {})
        full, _ = await mean_speed(http, deep, {})
        _, predicted = await post(
            http, deep.url + "/sim/predict", {**GREETING, "speculative.n_max": 2}
        )
    assert requested == pytest.approx(started, rel=0.05)
    assert requested_acc == pytest.approx(started_acc, abs=0.06)
    assert requested == pytest.approx(predicted["decode_tok_s"], rel=0.05)
    assert predicted["draft"]["n_max"] == 2
    assert full > requested * 1.02  # and depth 3 itself is still depth 3 (greeting: 1.71x)


# --- what depth costs inside one MTP process -------------------------------------------------


async def test_depth_0_in_an_mtp_process_pays_a_few_percent(http: aiohttp.ClientSession) -> None:
    with simulator(*SETUP_B, *MAX3) as mtp, simulator(*SETUP_B) as off:
        in_mtp, acceptance = await mean_speed(http, mtp, {"speculative.n_max": 0}, n=4)
        plain, _ = await mean_speed(http, off, {}, n=4)
        fresh = {"messages": [{"role": "user", "content": "Tell me about owls. " * 20}]}
        depth0 = {**fresh, "max_tokens": 4, "speculative.n_max": 0}
        _, mtp_out = await post(http, mtp.url + "/v1/chat/completions", depth0)
        _, off_out = await post(http, off.url + "/v1/chat/completions", {**fresh, "max_tokens": 4})
    assert acceptance == 0.0 and "draft_n" not in mtp_out["timings"]
    # the MTP head's catch-up pass and recurrent snapshots: "a few %" of decode
    # (docs/published-figures.md#hybrid-models)
    assert 1.01 <= plain / in_mtp <= 1.10, plain / in_mtp
    # and its prompt processing, as every request of an MTP process
    assert mtp_out["timings"]["prompt_ms"] > off_out["timings"]["prompt_ms"] * 1.05


async def neighbour_pair(
    http: aiohttp.ClientSession, sim: Sim, neighbour_depth: int, bursts: int = 8
) -> float:
    """Mean decode tok/s of a depth-3 request while a second one decodes at neighbour_depth."""
    speeds = []
    for _ in range(bursts):
        body = {**GREETING, "max_tokens": 250}
        (_, mine), (_, _other) = await asyncio.gather(
            post(http, sim.url + "/v1/chat/completions", {**body, "speculative.n_max": 3}),
            post(
                http,
                sim.url + "/v1/chat/completions",
                {**body, "speculative.n_max": neighbour_depth},
            ),
        )
        speeds.append(mine["timings"]["predicted_per_second"])
    return sum(speeds) / len(speeds)


async def test_mixed_depths_across_slots_cost_extra_passes(http: aiohttp.ClientSession) -> None:
    # At SETUP_B's time scale (400) a millisecond of a loaded machine's wall-clock jitter is
    # 0.4 simulated seconds of decoding: two fresh-clone CI runs read 0.959x against a quiet
    # 0.89-0.92x. At 50 it weighs 8 times less, and the 16 pairs take ~2 s.
    with simulator(*SETUP_B, "--time-scale", "50", *MAX3, "-np", "2") as sim:
        uniform = await neighbour_pair(http, sim, 3)
        mixed = await neighbour_pair(http, sim, 2)
    # The same depth-3 request, beside a neighbour that drafts less: without the mixing cost it
    # would run slightly faster (less speculative work in the shared step); hybrid slots at
    # different depths cannot share a ubatch, so it runs slower.
    assert mixed < uniform * 0.95, (mixed, uniform)


async def step_ms_beside(
    http: aiohttp.ClientSession, sim: Sim, depth: int, other_depth: int
) -> float:
    """Step time of a short request at `depth` while a long one decodes at `other_depth`.

    The process forces 3 drafts per step at depth 3 (n_min 3), so a depth-3 request's steps
    are draft_n / 3 and a depth-0 request's are its tokens. The short one is sent once the long
    one decodes (its first streamed chunk: an event, not a guess): every one of its steps is
    beside it, and the step times are the model's, not the wall clock's. Sent together, a
    millisecond between their arrivals was 0.4 simulated seconds at time scale 400, a dozen
    steps alone: the comparison below went either way on a loaded machine.
    """
    body = {**GREETING, "ignore_eos": True}
    short = {**body, "max_tokens": 40, "speculative.n_max": depth}
    long = {**body, "max_tokens": 100_000, "stream": True, "speculative.n_max": other_depth}
    async with http.post(sim.url + "/v1/chat/completions", json=long) as running:
        await running.content.readline()  # decoding now, for far longer than the short one
        _, out = await post(http, sim.url + "/v1/chat/completions", short)
        running.connection.transport.abort()  # type: ignore[union-attr]
    await slots_idle(http, sim)  # the long one's slot is free again before the next pair
    t = out["timings"]
    steps = t["draft_n"] / 3 if depth else t["predicted_n"]
    return float(t["predicted_ms"]) / steps


async def slots_idle(http: aiohttp.ClientSession, sim: Sim) -> None:
    """Until no slot of the simulator is processing (its GET /slots says so)."""
    async with asyncio.timeout(30):
        while True:
            async with http.get(sim.url + "/slots") as response:
                if not any(slot["is_processing"] for slot in await response.json()):
                    return
            await asyncio.sleep(0.01)


async def test_slots_at_different_depths_share_one_step(http: aiohttp.ClientSession) -> None:
    # llama-server advances all slots one step at a time: a depth-0 request beside a drafting
    # one waits for the same (speculative, split) step as its neighbour, and vice versa.
    with simulator(*SETUP_B, *FORCED, "-np", "2") as sim:
        plain_beside_drafting = await step_ms_beside(http, sim, 0, 3)
        drafting_beside_plain = await step_ms_beside(http, sim, 3, 0)
        plain_beside_plain = await step_ms_beside(http, sim, 0, 0)
    assert plain_beside_drafting == pytest.approx(drafting_beside_plain, rel=0.05)
    assert plain_beside_drafting > 1.5 * plain_beside_plain


async def test_native_completion_stream_shape(http: aiohttp.ClientSession, forced_sim: Sim) -> None:
    body = {"prompt": PROMPT, "n_predict": 6, "stream": True, "speculative.n_max": 2}
    events = await sse(http, forced_sim.url + "/completion", body)
    chunks = [json.loads(data) for _, data in events]  # no "[DONE]" on llama-server's own API
    assert [c["stop"] for c in chunks] == [False] * 6 + [True]
    assert "".join(c["content"] for c in chunks[:-1])
    final = chunks[-1]
    assert final["tokens_predicted"] == 6 and final["stop_type"] == "limit"
    assert final["timings"]["draft_n"] % 2 == 0 and "timings" not in chunks[0]


async def test_sim_predict_sees_the_depths_decoding_now(http: aiohttp.ClientSession) -> None:
    with simulator(*SETUP_B, *MAX3, "-np", "2") as sim:
        body = {**GREETING, "max_tokens": 2000, "stream": True, "speculative.n_max": 3}
        async with http.post(sim.url + "/v1/chat/completions", json=body) as running:
            await running.content.readline()  # decoding at depth 3 now
            ask = {**GREETING, "max_tokens": 64, "speculative.n_max": 2}
            _, beside = await post(http, sim.url + "/sim/predict", ask)
            _, uniform = await post(http, sim.url + "/sim/predict", {**ask, "concurrent": 2})
            running.connection.transport.abort()  # type: ignore[union-attr]
    assert beside["concurrent"] == uniform["concurrent"] == 2
    # beside a depth-3 neighbour it pays for the mixed depths and the heavier neighbour,
    # which a hypothetical load of two depth-2 requests does not
    assert beside["decode_tok_s"] < 0.9 * uniform["decode_tok_s"]
