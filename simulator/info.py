"""Introspection endpoints: health, models, props, slots, metrics, tokenize, detokenize."""

from __future__ import annotations

import time
from typing import Any

from aiohttp import web

from simulator.engine import Engine
from simulator.formats import BUILD_INFO
from simulator.prompts import BadRequest
from simulator.webcommon import ENGINE, dumps, error_response, json_body, model_name


async def health(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


async def models(request: web.Request) -> web.Response:
    engine = request.app[ENGINE]
    name, info = model_name(engine), engine.preset.model
    return web.json_response(
        {
            "models": [
                {
                    "name": name,
                    "model": name,
                    "modified_at": "",
                    "size": "",
                    "digest": "",
                    "type": "model",
                    "description": "",
                    "tags": [""],
                    "capabilities": ["completion"],
                    "parameters": "",
                    "details": {
                        "parent_model": "",
                        "format": "gguf",
                        "family": "",
                        "families": [""],
                        "parameter_size": "",
                        "quantization_level": "",
                    },
                }
            ],
            "object": "list",
            "data": [
                {
                    "id": name,
                    "object": "model",
                    "created": int(time.time()),
                    "owned_by": "llamacpp",
                    "meta": {
                        "vocab_type": 2,
                        "n_vocab": info.n_vocab,
                        "n_ctx_train": info.n_ctx_train,
                        "n_embd": info.n_embd,
                        "n_params": info.n_params,
                        "size": info.size,
                    },
                }
            ],
        }
    )


def _params(engine: Engine) -> dict[str, Any]:
    d = engine.draft
    return {
        "n_predict": -1,
        "temperature": 0.8,
        "speculative.n_max": d.n_max,
        "speculative.n_min": d.n_min,
        "speculative.p_min": d.p_min,
        "speculative.type": d.spec_type if d.enabled else "none",
        "speculative.types": "none",  # llama-server's quirk: "none" even with speculation on
        "timings_per_token": False,
    }


async def props(request: web.Request) -> web.Response:
    engine = request.app[ENGINE]
    settings = {
        "id": 0,
        "id_task": -1,
        "n_ctx": engine.n_ctx,
        "speculative": engine.draft.enabled,
        "is_processing": False,
        "params": _params(engine),
    }
    return web.json_response(
        {
            "default_generation_settings": settings,
            "total_slots": len(engine.pool.slots),
            "model_alias": model_name(engine),
            "model_path": engine.config.model or engine.preset.model.name,
            "modalities": {"vision": False, "audio": False},
            "chat_template": "{% for message in messages %}<|im_start|>...{% endfor %}",
            "bos_token": "<|endoftext|>",
            "eos_token": "<|im_end|>",
            "build_info": BUILD_INFO,
        }
    )


async def slots(request: web.Request) -> web.Response:
    engine = request.app[ENGINE]
    return web.json_response(
        [
            {
                "id": s.id,
                "id_task": s.task_id,
                "n_ctx": engine.n_ctx,
                "speculative": engine.draft.enabled,
                "is_processing": s.busy,
                "n_prompt_tokens": s.n_prompt,
                "n_cached_tokens": len(s.cache),
                "params": _params(engine),
                "next_token": [
                    {
                        "has_next_token": s.busy,
                        "has_new_line": False,
                        "n_remain": -1,
                        "n_decoded": s.n_decoded,
                    }
                ],
            }
            for s in engine.pool.slots
        ]
    )


async def metrics(request: web.Request) -> web.Response:
    engine = request.app[ENGINE]
    if not engine.config.metrics:
        return error_response(
            501,
            "This server does not support metrics endpoint. Start it with `--metrics`",
            "not_supported_error",
        )
    text = engine.metrics.render(processing=engine.pool.n_busy, deferred=engine.pool.n_waiting)
    return web.Response(text=text, content_type="text/plain", charset="utf-8")


async def tokenize(request: web.Request) -> web.Response:
    engine = request.app[ENGINE]
    body = await json_body(request)
    content = body.get("content", "")
    if not isinstance(content, str):
        raise BadRequest("'content' must be a string")
    if not body.get("with_pieces"):
        return web.json_response({"tokens": engine.tokenizer.encode(content)})
    tok = engine.tokenizer
    pieces = [{"id": tok.token_id(p), "piece": p} for p in tok.pieces(content)]
    return web.json_response({"tokens": pieces}, dumps=dumps)


async def detokenize(request: web.Request) -> web.Response:
    engine = request.app[ENGINE]
    body = await json_body(request)
    tokens = body.get("tokens", [])
    if not isinstance(tokens, list) or not all(isinstance(t, int) for t in tokens):
        raise BadRequest("'tokens' must be an array of integers")
    return web.json_response({"content": engine.tokenizer.decode(tokens)}, dumps=dumps)
