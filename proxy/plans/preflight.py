"""Before the backends start: will their llama-server processes fit in GPU memory?

Each local llama-server backend loads its own copy of the weights, so a pool of three profiles
needs three times the model plus each one's KV cache and draft buffers (supervisor.memory). When
nvidia-smi answers, the needs are compared with the free memory and backends that cannot fit
are reported clearly: llama-server would start anyway, offload layers to the CPU and decode far
slower. Only a warning: the estimate errs high and the operator may know better.

Backends pinned to GPUs (CUDA_VISIBLE_DEVICES=1 in a profile's env, as in config.toml) are
checked per GPU, a backend's need split evenly over the GPUs it sees (llama.cpp splits layers
across them); GPU indices are taken as nvidia-smi's, which holds with CUDA_DEVICE_ORDER=PCI_BUS_ID.

Blocking (file stats, nvidia-smi with a timeout): run it before the event loop starts.
"""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from structlog.typing import FilteringBoundLogger

from proxy.config.settings import DEFAULT_DRAFT_N_MAX, ModelSettings, ProfileSettings, Settings
from proxy.plans.gguf import GgufError, GgufFacts, read_gguf
from proxy.plans.plan import ModelPlan, plans_of, processes
from supervisor.flags import CACHE_TYPE_K, CACHE_TYPE_V, CTX_SIZE, GPU_LAYERS, flag_value
from supervisor.memory import (
    DRAFT_HEADROOM_BYTES,
    GIB,
    check_backends_fit,
    estimate_vram_bytes,
    query_free_gpu_bytes,
)

# -c unset (or 0): llama-server's --fit sizes the context to the free memory, never below
# --fit-ctx (default 4096); the estimate assumes that floor.
ASSUMED_CTX = 4096
# Bytes per stored value of each KV cache type (block formats: block bytes / 32 values).
_F16 = 2.0
_KV_TYPE_BYTES = {
    "f32": 4.0,
    "f16": 2.0,
    "bf16": 2.0,
    "q8_0": 34 / 32,
    "q5_1": 24 / 32,
    "q5_0": 22 / 32,
    "q4_1": 20 / 32,
    "q4_0": 18 / 32,
    "iq4_nl": 18 / 32,
}
_SPLIT = re.compile(r"-(\d{5})-of-(\d{5})\.gguf$")

FreeMemory = Callable[[], list[int] | None]  # free bytes of each GPU, None: unknown


@dataclass(frozen=True)
class BackendNeed:
    """Estimated GPU memory of one local llama-server backend."""

    name: str
    bytes: int
    detail: str  # what the estimate rests on, e.g. "model 4.0 GiB, ctx 8192, draft n_max 3"
    devices: tuple[int, ...] | None = None  # CUDA_VISIBLE_DEVICES indices; None: every GPU


@dataclass
class Preflight:
    needs: list[BackendNeed] = field(default_factory=list)
    free_per_gpu: list[int] | None = None  # None: no nvidia-smi (or it failed): not checked
    warnings: list[str] = field(default_factory=list)  # the backends may not fit or cannot start

    @property
    def total_bytes(self) -> int:
        return sum(need.bytes for need in self.needs)

    @property
    def free_bytes(self) -> int | None:
        return None if self.free_per_gpu is None else sum(self.free_per_gpu)

    def summary(self) -> str:
        """One line: the estimate against what is free."""
        if not self.needs:
            return "gpu memory: no local llama-server backend uses the GPU"
        free = (
            "free: unknown (no nvidia-smi), not checked"
            if self.free_per_gpu is None
            else f"free: {gib(sum(self.free_per_gpu))} on {len(self.free_per_gpu)} GPU(s)"
        )
        return f"gpu memory: the backends need ~{gib(self.total_bytes)}, {free}"


def run_preflight(
    settings: Settings,
    *,
    free_memory: FreeMemory = query_free_gpu_bytes,
    plans: Mapping[str, ModelPlan] | None = None,
) -> Preflight:
    """Estimate every local llama-server backend of the plans (default: the initial ones) and
    compare with the free GPU memory."""
    plans = plans or plans_of(settings)
    result = Preflight()
    for model in settings.models:
        result.needs += model_needs(model, plans[model.name], result.warnings)
    if result.needs:
        result.free_per_gpu = free_memory()
        if result.free_per_gpu is not None:
            result.warnings.extend(fit_warnings(result.needs, result.free_per_gpu))
    return result


def fit_warnings(needs: Sequence[BackendNeed], free_per_gpu: Sequence[int]) -> list[str]:
    """The backends' needs against the free memory: as a whole, or per GPU when they are
    pinned."""
    pinned = [need.devices for need in needs if need.devices is not None]
    if not pinned or any(i >= len(free_per_gpu) for devices in pinned for i in devices):
        # Unpinned (or pinned to GPUs nvidia-smi does not list): llama.cpp spreads over all.
        return check_backends_fit({need.name: need.bytes for need in needs}, sum(free_per_gpu))
    warnings = []
    for index, free in enumerate(free_per_gpu):
        shares = {
            need.name: need.bytes // len(seen)
            for need in needs
            if index in (seen := need.devices or tuple(range(len(free_per_gpu))))
        }
        warnings += [f"GPU {index}: {warning}" for warning in check_backends_fit(shares, free)]
    return warnings


def render(result: Preflight) -> list[str]:
    """Human-readable lines for `check-config`: the summary, then one line per backend."""
    lines = [result.summary()]
    lines += [f"  {need.name}: ~{gib(need.bytes)} ({need.detail})" for need in result.needs]
    return lines


def log_result(result: Preflight, log: FilteringBoundLogger) -> None:
    """At `serve` start-up: the estimate as one log line, each warning as its own."""
    log.info(
        "gpu_memory_check",
        summary=result.summary(),
        need_bytes=result.total_bytes,
        free_bytes=result.free_bytes,
        backends={need.name: need.bytes for need in result.needs},
    )
    for warning in result.warnings:
        log.warning("gpu_memory_warning", message=warning)


def gib(size: float) -> str:
    return f"{size / GIB:.2f} GiB"


def model_needs(model: ModelSettings, plan: ModelPlan, warnings: list[str]) -> list[BackendNeed]:
    """The GPU memory of a model's local llama-server processes under a plan (the names are
    the backends'): one copy of the weights per process."""
    if model.backend != "llama-server":
        return []  # the simulator uses no GPU
    needs = [_estimate(model, p.profile, p.name, warnings) for p in processes(model, plan)]
    return [need for need in needs if need is not None]


def _estimate(
    model: ModelSettings, profile: ProfileSettings, name: str, warnings: list[str]
) -> BackendNeed | None:
    """One backend's need; None when it runs elsewhere (url) or on the CPU (-ngl 0)."""
    if profile.url is not None or model.model_path is None:
        return None
    args = [*model.args, *profile.args]
    if flag_value(args, GPU_LAYERS) == "0" or _gpus_hidden(profile.env):
        return None  # runs on the CPU
    size = model_file_size(model.model_path)
    if size is None:
        warnings.append(f"backend {name}: model file {model.model_path} not found")
        return None
    n_ctx, ctx_note = _context(args, profile.env)
    draft = profile.draft()
    n_max = 0 if draft.is_off else (draft.n_max or DEFAULT_DRAFT_N_MAX)
    kv_scale = _kv_bytes(args) / _F16
    shape = gguf_shape(model.model_path)
    # The estimate's KV terms assume f16; a quantized cache shrinks them all alike, as a
    # shorter f16 context would. Without the GGUF's shape, a heuristic on the file size.
    need = estimate_vram_bytes(
        size,
        round(n_ctx * kv_scale),
        n_layers=shape.kv_layers() if shape else None,
        n_embd=shape.embedding_length if shape else None,
        n_embd_kv=shape.kv_width() if shape else None,
        draft_n_max=n_max,
    )
    detail = f"model {gib(size)}, {ctx_note}" + (f", draft n_max {n_max}" if n_max else "")
    if shape is not None and shape.kv_layers() is not None and shape.kv_width() is not None:
        detail += f", KV {shape.kv_layers()} layers x {shape.kv_width()} (from the GGUF)"
    if kv_scale != 1:
        detail += f", KV cache {kv_scale:.2g}x f16"
    if draft.draft_model is not None:
        draft_size = model_file_size(draft.draft_model)
        if draft_size is None:
            warnings.append(f"backend {name}: draft model {draft.draft_model} not found")
        else:
            need += estimate_vram_bytes(draft_size, n_ctx)
            detail += f", draft model {gib(draft_size)}"
    return BackendNeed(name, need, detail, _devices(profile.env))


def _context(args: Sequence[str], env: Mapping[str, str]) -> tuple[int, str]:
    raw = flag_value(args, CTX_SIZE) or env.get("LLAMA_ARG_CTX_SIZE")
    n_ctx = int(raw) if raw is not None and raw.isdigit() else 0
    if n_ctx > 0:
        return n_ctx, f"ctx {n_ctx}"
    return ASSUMED_CTX, f"ctx {ASSUMED_CTX} assumed (-c not set: --fit decides)"


def _visible_devices(env: Mapping[str, str]) -> str | None:
    return env.get("CUDA_VISIBLE_DEVICES", os.environ.get("CUDA_VISIBLE_DEVICES"))


def _gpus_hidden(env: Mapping[str, str]) -> bool:
    value = _visible_devices(env)
    return value is not None and value.strip() in ("", "-1")


def _devices(env: Mapping[str, str]) -> tuple[int, ...] | None:
    """GPU indices the backend sees; None (every GPU) when unset or not plain indices."""
    value = _visible_devices(env)
    parts = [part.strip() for part in (value or "").split(",") if part.strip()]
    if not parts or not all(part.isdigit() for part in parts):
        return None
    return tuple(int(part) for part in parts)


def _kv_bytes(args: Sequence[str]) -> float:
    k = flag_value(args, CACHE_TYPE_K) or "f16"
    v = flag_value(args, CACHE_TYPE_V) or "f16"
    return (_KV_TYPE_BYTES.get(k, _F16) + _KV_TYPE_BYTES.get(v, _F16)) / 2


def gguf_shape(path_text: str) -> GgufFacts | None:
    """The GGUF's metadata, for the KV shape; None when the file is not a readable GGUF."""
    path = Path(path_text).expanduser()
    try:
        stat = path.stat()
    except OSError:
        return None
    return _cached_shape(path, stat.st_size, stat.st_mtime_ns)


@functools.lru_cache(maxsize=16)
def _cached_shape(path: Path, _size: int, _mtime_ns: int) -> GgufFacts | None:
    # Keyed by size and time too: a file replaced in place (a reload) is read again.
    try:
        return read_gguf(path)
    except GgufError:
        return None


def model_file_size(path_text: str) -> int | None:
    """Size of a GGUF file; a split model (name-00001-of-00003.gguf) counts all its parts."""
    path = Path(path_text).expanduser()
    try:
        size = path.stat().st_size
    except OSError:
        return None
    match = _SPLIT.search(path.name)
    if match is None:
        return size
    stem = path.name[: match.start()]
    total = 0
    for part in range(1, int(match.group(2)) + 1):
        sibling = path.with_name(f"{stem}-{part:05d}-of-{match.group(2)}.gguf")
        try:
            total += sibling.stat().st_size
        except OSError:
            continue
    return total


def pool_fits(
    model: ModelSettings, running: ModelPlan, free_memory: FreeMemory = query_free_gpu_bytes
) -> tuple[bool | None, str]:
    """Would the model's pool fit once its running process(es) stopped? None: unknown.

    Blocking (nvidia-smi): call it from a thread once the loop runs.
    """
    if model.backend != "llama-server":
        return True, "the simulator uses no GPU"
    pool = model_needs(model, ModelPlan(model.name, "pool", ""), [])
    if not pool:
        return True, "no process of the pool uses the GPU"
    total = sum(need.bytes for need in pool)
    free = free_memory()
    if free is None:
        return None, f"pool ~{gib(total)}, free GPU memory unknown (no nvidia-smi)"
    mine = sum(need.bytes for need in model_needs(model, running, []))
    available = sum(free) + mine  # the running process's share is freed before the pool starts
    note = (
        f"pool ~{gib(total)} + {gib(DRAFT_HEADROOM_BYTES)} headroom, "
        f"~{gib(available)} available once the running process stops"
    )
    return total + DRAFT_HEADROOM_BYTES <= available, note
