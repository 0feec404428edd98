"""Serve the live page's files under /ui/.

The files hold no data and no secret: the page asks the admin API for everything
(proxy.serving.admin) with the key it reads from the URL's fragment (`/ui/#key=...`), which browsers
never send to a server. So the files are served without a key, like /health, and a client API key is
not asked for either. They are read once, when the app is made (a few kilobytes), and sent with
headers that keep them on this origin: a Content-Security-Policy that allows only the page's own
script and style and requests to this proxy, no framing, no referrer.
"""

from __future__ import annotations

from importlib import resources

from aiohttp import web

from proxy.serving.expect import expect_handler
from proxy.serving.live import quiet_read
from proxy.state import STATE

PREFIX = "/ui"
_TYPES = {
    "index.html": "text/html",
    "app.js": "text/javascript",
    "app.css": "text/css",
    "icon.svg": "image/svg+xml",
}
_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
        "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}
FILES = web.AppKey("ui_files", dict)


def link(host: str, port: int, key: str = "ADMIN_KEY") -> str:
    """The page's address for the start-up banner and log: the admin key goes after `#key=`
    (a placeholder unless the key is one the proxy made up for this run and shows anyway)."""
    shown = f"[{host}]" if ":" in host else host
    if host in ("0.0.0.0", "::", ""):  # noqa: S104 - a listen address, shown, not bound here
        shown = "127.0.0.1"
    return f"http://{shown}:{port}{PREFIX}/#key={key}"


def add_routes(app: web.Application) -> None:
    app[FILES] = {name: _read(name) for name in _TYPES}
    app.router.add_get(PREFIX, _to_slash, expect_handler=expect_handler)
    app.router.add_get(PREFIX + "/", _index, expect_handler=expect_handler)
    app.router.add_get(PREFIX + "/{name}", _file, expect_handler=expect_handler)


def _read(name: str) -> bytes:
    return resources.files("proxy.ui").joinpath("static", name).read_bytes()


async def _to_slash(request: web.Request) -> web.StreamResponse:
    _enabled_or_404(request)
    raise web.HTTPPermanentRedirect(PREFIX + "/")


async def _index(request: web.Request) -> web.StreamResponse:
    return _send(request, "index.html")


async def _file(request: web.Request) -> web.StreamResponse:
    name = request.match_info["name"]
    if name not in _TYPES or name == "index.html":
        raise web.HTTPNotFound()
    return _send(request, name)


def _send(request: web.Request, name: str) -> web.StreamResponse:
    _enabled_or_404(request)
    body = request.app[FILES][name]
    response = web.Response(body=body, content_type=_TYPES[name], charset="utf-8")
    response.headers.update(_HEADERS)
    return quiet_read(request, response)


def _enabled_or_404(request: web.Request) -> None:
    if not request.app[STATE].settings.ui.enabled:
        raise web.HTTPNotFound()
