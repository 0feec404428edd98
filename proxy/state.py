"""The long-lived objects of one proxy app, kept under a typed app key (no module globals)."""

from __future__ import annotations

import asyncio
import itertools
import secrets
import time
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import structlog
from aiohttp import web
from prometheus_client import CollectorRegistry
from structlog.typing import FilteringBoundLogger

from proxy.config.settings import Settings
from proxy.lifecycle.fail_fast import StartupWatch
from proxy.lifecycle.learned_file import LearnedFile
from proxy.observability.bookkeeping import Bookkeeping
from proxy.observability.metrics import ProxyMetrics
from proxy.observability.recent import RecentRequests
from proxy.plans.plan import ModelPlan
from proxy.plans.speculation import Speculation
from proxy.routing.router import Router
from proxy.serving.admission import Admission
from proxy.serving.backends import LiveBackend, LiveBackends
from proxy.serving.dropped_numbers import DroppedNumbers
from proxy.serving.forward import Timeouts
from proxy.serving.model_names import ModelCatalog
from proxy.serving.spec_counters import SpecCounterTracker
from supervisor.supervisor import Supervisor
from supervisor.template_check import LateSystem


class RequestIds:
    """Ids for requests that bring none, unique across restarts: a random prefix per process and
    a counter (uuid4 read the kernel's random source for every request: ~60 us cold)."""

    def __init__(self) -> None:
        self._prefix = secrets.token_hex(8)
        self._count = itertools.count()

    def new(self) -> str:
        return f"{self._prefix}{next(self._count):016x}"  # 32 hex digits, as a uuid's


@dataclass
class ProxyState:
    settings: Settings
    registry: CollectorRegistry
    metrics: ProxyMetrics
    backends: LiveBackends
    models: ModelCatalog
    router: Router[LiveBackend]
    timeouts: Timeouts
    admission: Admission
    plans: dict[str, ModelPlan] = field(default_factory=dict)
    """How each model is served now (proxy.plans.plan); auto's settles at its first probe."""
    speculation: dict[str, Speculation] = field(default_factory=dict)
    """What each backend of the plans drafts with, by name (set with the plans: the answers'
    X-MTP-Spec-Type reads it on the request path)."""
    replanning: set[str] = field(default_factory=set)
    """Models whose processes are being replaced by another shape: their requests wait."""
    replans: set[asyncio.Task[None]] = field(default_factory=set)
    """Those replacements (proxy.plans.auto), awaited after the supervisor stopped."""
    started_at: float = field(default_factory=time.time)
    spec_counters: SpecCounterTracker = field(default_factory=SpecCounterTracker)
    dropped: DroppedNumbers = field(default_factory=DroppedNumbers)
    """Answers whose numbers routing refused to learn: counted, logged once a minute."""
    background: set[asyncio.Task[None]] = field(default_factory=set)
    bookkeeping: Bookkeeping = field(default_factory=Bookkeeping)
    request_ids: RequestIds = field(default_factory=RequestIds)
    recent: RecentRequests = field(default_factory=RecentRequests)
    """The last finished requests and the depth chart, for the live page
    (proxy.observability.recent)."""
    inflating: asyncio.Semaphore = field(default_factory=lambda: asyncio.Semaphore(1))
    """gzip request bodies inflated at once (proxy.serving.body)."""
    parsing: asyncio.Semaphore = field(default_factory=lambda: asyncio.Semaphore(1))
    """Large request bodies counted and parsed at once, off the loop (proxy.serving.body_items)."""
    late_system: dict[str, LateSystem | None] = field(default_factory=dict)
    """Each backend's chat-template check, by name (supervisor.template_check), as the
    supervisor last reported it: the request path reads it without asking the supervisor."""
    live_agents: dict[str, str] = field(default_factory=dict)
    """Each model's live agent: the session key of its last main turn with tools, which side
    requests are told from (proxy.serving.side_requests)."""
    calibrating: dict[str, float] = field(default_factory=dict)
    """Backends in their start-up calibration now, by name -> when it began (time.monotonic):
    /health says why they are not ready yet."""
    session: aiohttp.ClientSession | None = None
    supervisor: Supervisor | None = None
    config_path: Path | None = None  # the file a reload re-reads (None: the embedded default)
    learned_file: LearnedFile | None = None
    """The learned file (routing.learned_file) as the proxy last read or wrote it (None: none)."""
    listening: bool = False  # the listener is up: READY=1 may be sent from now on
    notified_ready: bool = False
    startup: StartupWatch = field(default_factory=StartupWatch)
    """Models ready once since start-up, and the first that cannot start
    (proxy.lifecycle.fail_fast)."""
    # Bound once (logging is configured before the app is made): building a logger from
    # structlog's configuration for every request took ~70 us on a cold path.
    request_log: FilteringBoundLogger = field(
        default_factory=lambda: structlog.get_logger("proxy.request").bind()
    )

    def client(self) -> aiohttp.ClientSession:
        if self.session is None:
            raise RuntimeError("the upstream client session exists only while the app runs")
        return self.session


STATE = web.AppKey("state", ProxyState)
