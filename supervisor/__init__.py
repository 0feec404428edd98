"""Lifecycle of backend processes (llama-server or the simulator): spawn, readiness, restart,
stop. Knows nothing of HTTP routing; the proxy depends on it, never the reverse."""

from supervisor.backend import Backend, InFlight, OnChange
from supervisor.commandline import LlamaServerNotFoundError, llama_server_argv, resolve_llama_server
from supervisor.settings import SupervisorSettings
from supervisor.spec import BackendSpec, DraftSpec
from supervisor.states import BackendState
from supervisor.supervisor import Supervisor

__all__ = [
    "Backend",
    "BackendSpec",
    "BackendState",
    "DraftSpec",
    "InFlight",
    "LlamaServerNotFoundError",
    "OnChange",
    "Supervisor",
    "SupervisorSettings",
    "llama_server_argv",
    "resolve_llama_server",
]
