"""The request path: client connections, bodies, handlers, the exchange with a backend, and
LiveBackends, the proxy's live view of its backends. The map is in ``proxy``."""
