"""What the routing brain reads of the processes that serve requests: it owns these views, the
serving layer implements them.

Routing holds no process and no connection (llama-swap's scheduler is the model): it reads a
backend's identity, readiness and load through ``BackendView``, finds backends through
``Backends``, and hands each decision back as data (``router.Route``), which the caller acts on.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, TypeVar


class BackendView(Protocol):
    """One backend process as routing sees it."""

    @property
    def name(self) -> str: ...

    @property
    def model(self) -> str: ...

    @property
    def profile(self) -> str:
        """The profile it serves; on a process serving per-request depths, the plan's label."""
        ...

    @property
    def ready(self) -> bool: ...

    @property
    def has_room(self) -> bool:
        """Ready, with a free slot."""
        ...

    @property
    def in_flight(self) -> int:
        """Requests on it now."""
        ...

    @property
    def slots(self) -> int: ...


B_co = TypeVar("B_co", bound=BackendView, covariant=True)


class Backends(Protocol[B_co]):
    """The backends routing chooses among."""

    def get(self, name: str) -> B_co | None: ...

    def of_model(self, model: str) -> Sequence[B_co]: ...

    def ready_of_model(self, model: str) -> Sequence[B_co]: ...
