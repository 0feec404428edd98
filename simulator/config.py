"""The simulator's run-time configuration (built by simulator/cli.py from llama-server's flags)."""

from __future__ import annotations

from dataclasses import dataclass, field

from simulator.model import OFF, DraftSettings


@dataclass(frozen=True)
class SimConfig:
    host: str = "127.0.0.1"
    port: int = 8080
    model: str | None = None  # -m as given; served as the model id unless --alias
    alias: str | None = None
    n_parallel: int = 1
    n_ctx: int = 0  # 0: the preset's default context
    threads: int = 1
    metrics: bool = False
    draft: DraftSettings = field(default_factory=lambda: OFF)
    preset: str = "setup-b"
    time_scale: float = 1.0
    load_time: float = 0.0
    seed: int = 0
    latent_sigma: float | None = None  # None: the preset's; 0 makes every session latent 1
    # --acceptance-scale: multiplies the acceptance of every request of that kind (a drafter
    # that is bad at code, say); tests and the routing benchmark use it to make one profile
    # collapse on one kind of traffic.
    acceptance_scale: dict[str, float] = field(default_factory=dict)
    # "speculative.n_max" per request, as the project's patched llama-server; False
    # (--ignore-request-draft) ignores the key like stock llama-server, which compiles it out.
    request_draft: bool = True
    # llama-server's host-memory prompt cache (-cram/--cache-ram MiB, default 8192; 0 disables):
    # a slot's state is saved there before another prompt takes the slot, and loaded back when
    # its prompt returns (simulator/slots.py); --cache-idle-slots saves every idle slot at each
    # new task.
    cache_ram_mib: int = 8192
    cache_idle_slots: bool = True
    # --[no-]refuse-late-system: answer a system message that is not first with the Qwen3.5/3.6
    # template's 500 (simulator/template.py); None: as the preset says ([chat_template]).
    refuse_late_system: bool | None = None
