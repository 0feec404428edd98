"""The route lists of proxy/serving/passthrough.py are the ones docs/api.md promises.

tests/proxy/test_client_routes.py walks REFUSED, FORWARDED_POST, FORWARDED_GET and COMPUTED on
a real proxy; walked from the product's own lists, a route dropped from one of them dropped its
test too (a refused route then answered 404, a forwarded one 404, an embedding route took no
slot, and every test stayed green). Here each list is held to the docs' sentences.
"""

from __future__ import annotations

import re
from pathlib import Path

from proxy.serving.passthrough import COMPUTED, FORWARDED_GET, FORWARDED_POST, REFUSED

API_DOC = Path(__file__).resolve().parents[2] / "docs" / "api.md"
METHOD = re.compile(r"^(GET|POST|PUT|PATCH|DELETE)$")


def section(start: str, end: str) -> list[str]:
    """The backticked items of docs/api.md between a heading and the sentence that ends its
    list, in order."""
    text = API_DOC.read_text(encoding="utf-8")
    body = text[text.index(start) :]
    return re.findall(r"`([^`]+)`", body[: body.index(end)])


def listed(items: list[str], *, carry: bool) -> set[tuple[str, str]]:
    """(method, path) of each route item: `POST /x`, `/x`, or `POST`/`DELETE /x` (a bare
    method shares the next item's path). A path without a method takes the last one named
    (`carry`, the forwarded list's way), or any method, "*" (the refused list's way)."""
    routes: set[tuple[str, str]] = set()
    last, waiting = "*", []
    for item in items:
        if METHOD.match(item):
            waiting.append(item)
            continue
        method, _, path = item.rpartition(" ")
        if not path.startswith("/"):
            continue
        last = method or (last if carry else "*")
        routes.update((m, path) for m in (*waiting, last))
        waiting = []
    return routes


def test_every_refused_route_of_the_docs_is_refused_and_no_other() -> None:
    documented = listed(section("### Refused routes", "Anything else"), carry=False)
    refused = {(method, re.sub(r"\{[^}]*\}", "{id}", path)) for method, path in REFUSED}
    assert refused == documented


def test_every_forwarded_route_of_the_docs_is_forwarded() -> None:
    """The product may forward an unprefixed alias of a documented /v1 route besides."""
    documented = listed(section("### Forwarded routes", "They are not routed"), carry=True)
    forwarded = {("POST", p) for p in FORWARDED_POST} | {("GET", p) for p in FORWARDED_GET}
    assert documented <= forwarded, documented - forwarded
    aliases = {(m, p) for m, p in forwarded - documented if (m, "/v1" + p) in documented}
    assert forwarded - documented == aliases


def test_embeddings_and_reranking_and_only_they_take_a_slot() -> None:
    """docs/api.md: "Embeddings and reranking run on llama-server's slots: they take one"."""
    assert {p for p in FORWARDED_POST if "embed" in p or "rerank" in p} == COMPUTED
