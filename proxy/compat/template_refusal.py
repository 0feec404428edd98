"""A chat template's refusal, relayed as the client's error it is.

llama-server renders each chat request with the model's Jinja template, and when the template
raises it answers 500 with the Jinja trace as the message, e.g. Qwen3.5/3.6's "No user query
found in messages." (a system prompt alone, only assistant turns or only tool results), "No
messages provided." or a late system message the proxy could not mend. The request's messages
caused it, not the server: the same template renders every other request. A 500 says the
opposite, and the openai and anthropic SDKs retry it (twice, by default) before showing a server
fault. So the client gets a 400 (``invalid_request_error``) with the template's own words, in
its API's shape (the error middleware reshapes it for Anthropic's clients).
"""

from __future__ import annotations

import orjson

from proxy.compat.llama_errors import llama_error

STATUS = 400
_JINJA = "Jinja Exception: "


def template_refusal(status: int, body: bytes) -> bytes | None:
    """The 400's body for a backend's 500 that is its chat template's refusal; None if the
    answer is not one."""
    if status != 500 or _JINJA.encode() not in body:  # one byte search for every other answer
        return None
    error = llama_error(body)
    message = error.get("message") if error is not None else None
    if not isinstance(message, str) or _JINJA not in message:
        return None
    words = message.rsplit(_JINJA, 1)[1].strip()
    refusal = {
        "message": f"the model's chat template refused these messages: {words}",
        "type": "invalid_request_error",
        "param": "messages",
        "code": "template_refused",
    }
    return orjson.dumps({"error": refusal})
