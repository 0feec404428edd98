"""Runs requests through slots on the simulated clock: prefill, then verification steps.

Each step draws (drafted, accepted) from the model, costs model.step_ms simulated ms (sleeping
that divided by --time-scale), and yields the 1 + accepted tokens it produced, back to back.
Timings report simulated milliseconds, as llama-server reports its own measured ones.
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import random
from collections.abc import AsyncGenerator
from dataclasses import dataclass, field
from typing import Any

from simulator import model
from simulator.config import SimConfig
from simulator.depth import request_draft
from simulator.metrics import Metrics
from simulator.model import DraftSettings, Kind
from simulator.presets import Preset
from simulator.prompts import Prompt
from simulator.slots import HostCache, Slot, SlotPool, common_prefix
from simulator.textgen import OutputText, Passage
from simulator.tokens import Tokenizer, content_kind

_LATENT_KEY_CHARS = 2048  # the "first part" of a prompt that identifies its session
# Acceptance drifts with context by well under 0.1 % per 32 tokens (ctx_half is 50k-250k), so a
# request's drafting law is recomputed that often rather than at every step: steps are the
# simulator's hot loop (thousands of streams in the load benchmarks).
_LAW_REFRESH_TOKENS = 32


class ContextTooLong(ValueError):
    def __init__(self, n_prompt: int, n_ctx: int) -> None:
        super().__init__("the request exceeds the available context size, try increasing it")
        self.n_prompt = n_prompt
        self.n_ctx = n_ctx


@dataclass
class Timings:
    cache_n: int = 0
    prompt_n: int = 0
    prompt_ms: float = 0.0
    predicted_n: int = 0
    predicted_ms: float = 0.0
    draft_n: int = 0
    draft_accepted: int = 0

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "cache_n": self.cache_n,
            "prompt_n": self.prompt_n,
            "prompt_ms": self.prompt_ms,
            "prompt_per_token_ms": self.prompt_ms / self.prompt_n if self.prompt_n else 0.0,
            "prompt_per_second": 1e3 * self.prompt_n / self.prompt_ms if self.prompt_ms else 0.0,
            "predicted_n": self.predicted_n,
            "predicted_ms": self.predicted_ms,
            "predicted_per_token_ms": (
                self.predicted_ms / self.predicted_n if self.predicted_n else 0.0
            ),
            "predicted_per_second": (
                1e3 * self.predicted_n / self.predicted_ms if self.predicted_ms else 0.0
            ),
        }
        if self.draft_n > 0:  # llama-server leaves both out when nothing was drafted
            out["draft_n"] = self.draft_n
            out["draft_n_accepted"] = self.draft_accepted
        return out


@dataclass
class Job:
    tokens: list[int]
    kind: Kind
    latent: float
    limit: int  # tokens to produce
    natural: bool  # the limit is the answer's natural end (finish "stop"), not max_tokens
    passage: Passage
    start: int  # first passage token of the answer
    rng: random.Random
    task_id: int
    draft: DraftSettings  # what this request drafts (its "speculative.n_max" within the process's)
    timings: Timings = field(default_factory=Timings)
    produced: int = 0
    finish_reason: str = "length"

    def text(self, first: int, count: int) -> str:
        return self.passage.text(self.start + first, count)


class _Pacer:
    """Sleeps to absolute deadlines on the scaled clock, so loop lag does not accumulate."""

    def __init__(self, time_scale: float) -> None:
        self._loop = asyncio.get_running_loop()
        self._deadline = self._loop.time()
        self._scale = time_scale

    async def advance(self, sim_ms: float) -> None:
        self._deadline += sim_ms / 1e3 / self._scale
        delay = self._deadline - self._loop.time()
        await asyncio.sleep(delay if delay > 0 else 0)


def _digest(*parts: object) -> int:
    text = "\x1f".join(str(p) for p in parts)
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big")


def _host_cache(config: SimConfig, preset: Preset) -> HostCache | None:
    """llama-server's host-memory prompt cache, if on and the preset says what a state weighs."""
    cost = preset.prompt_cache
    if config.cache_ram_mib == 0 or cost.bytes_per_token <= 0:
        return None
    limit = -1.0 if config.cache_ram_mib < 0 else config.cache_ram_mib * 2.0**20
    return HostCache(limit, cost.bytes_per_token, cost.state_bytes)


def _depth(draft: DraftSettings) -> int:
    return draft.n_max if draft.enabled else 0


class Engine:
    def __init__(self, config: SimConfig, preset: Preset) -> None:
        self.config = config
        self.preset = preset
        self.draft = config.draft
        self.n_ctx = config.n_ctx or preset.model.n_ctx
        self.tokenizer = Tokenizer(preset.model.n_vocab)
        self.text = OutputText(self.tokenizer)
        self.pool = SlotPool(
            config.n_parallel, _host_cache(config, preset), save_idle=config.cache_idle_slots
        )
        self.metrics = Metrics()
        self._latent_sigma = (
            preset.acceptance.latent_sigma if config.latent_sigma is None else config.latent_sigma
        )
        self._tasks = itertools.count()
        self.acceptance_scale = dict(config.acceptance_scale)
        """--acceptance-scale, changed at run time by POST /sim/acceptance-scale (a fault: a
        drafter whose acceptance collapses, and comes back)."""
        self.drop_next = 0
        """Generation requests still to drop before answering (POST /sim/drop, a fault)."""
        refuse = config.refuse_late_system
        self.refuses_late_system = (
            preset.chat_template.refuse_late_system if refuse is None else refuse
        )

    def _natural_length(self, kind: Kind, digest: int) -> int:
        out = self.preset.output
        lo, hi = (
            (out.code_min, out.code_max) if kind is Kind.CODE else (out.prose_min, out.prose_max)
        )
        return lo + digest % (hi - lo + 1)

    def job(
        self,
        prompt: Prompt,
        max_tokens: int | None,
        ignore_eos: bool,
        depth: int | None = None,
        answer: str | None = None,
    ) -> Job:
        """Plan a request: tokens, kind, latent, length, draft depth. Raises ContextTooLong.
        ``answer``: the text the request's form fixes (JSON), which ends it."""
        tokens = self.tokenizer.encode(prompt.text)
        if len(tokens) >= self.n_ctx:
            raise ContextTooLong(len(tokens), self.n_ctx)
        kind = content_kind(prompt.text, prompt.last_user)
        task_id = next(self._tasks)
        digest = _digest(self.config.seed, prompt.text)
        room = self.n_ctx - len(tokens)
        passage = self.text.passage(kind) if answer is None else self.text.fixed(answer)
        length = self._natural_length(kind, digest) if answer is None else len(passage.texts)
        natural = room if ignore_eos and answer is None else min(room, length)
        wanted = natural if max_tokens is None or max_tokens < 0 else max_tokens
        return Job(
            tokens=tokens,
            kind=kind,
            latent=model.latent_factor(
                self.config.seed, prompt.text[:_LATENT_KEY_CHARS], self._latent_sigma
            )
            * self.acceptance_scale.get(kind.value, 1.0),
            limit=min(wanted, natural),
            natural=natural <= wanted and not ignore_eos,
            passage=passage,
            start=0 if answer is not None else passage.starts[digest % len(passage.starts)],
            rng=random.Random(_digest(self.config.seed, digest, task_id)),
            task_id=task_id,
            draft=request_draft(self.draft, depth),
        )

    async def run(self, job: Job) -> AsyncGenerator[int, None]:
        """Wait for a slot, prefill, then yield the number of new tokens after each step."""
        pool, process, draft, preset, t = self.pool, self.draft, job.draft, self.preset, job.timings
        slot = await pool.acquire(job.tokens)
        per_pos = [0] * draft.n_max if draft.enabled else []
        steps = busy = drafts = 0
        try:
            slot.task_id, slot.n_prompt, slot.n_decoded = job.task_id, len(job.tokens), 0
            t.cache_n = min(common_prefix(slot.cache, job.tokens), len(job.tokens) - 1)
            t.prompt_n = len(job.tokens) - t.cache_n
            slot.cache = job.tokens[: t.cache_n]  # what survives if we are cancelled mid-way
            t.prompt_ms = model.prefill_ms(preset, process, t.prompt_n, t.cache_n)
            t.prompt_ms += model.restore_ms(preset, slot.restored)
            pacer = _Pacer(self.config.time_scale)
            await pacer.advance(t.prompt_ms)
            context = len(job.tokens)
            pool.start_decoding(slot, _depth(draft), 0.0)
            law, law_context = None, 0
            while job.produced < job.limit:
                if law is None or context - law_context >= _LAW_REFRESH_TOKENS:
                    law, law_context = self._law(job, context), context
                    self._publish_overhead(slot, law, job.draft, context)
                concurrent = pool.n_decoding
                drafted, accepted = model.sample_step(job.rng, law, draft)
                step = self._step_ms(slot, draft, context, drafted)
                t.predicted_ms += step
                steps += 1
                busy += concurrent
                if drafted:
                    drafts += 1
                    t.draft_n += drafted
                    t.draft_accepted += accepted
                    for i in range(accepted):
                        per_pos[i] += 1
                await pacer.advance(step)
                new = min(1 + accepted, job.limit - job.produced)
                job.produced += new
                slot.n_decoded = t.predicted_n = job.produced
                context += new
                yield new
            job.finish_reason = "stop" if job.natural else "length"
        finally:
            if slot.decoding:
                generated = job.passage.token_ids(job.start, job.produced)
                pool.release(slot, job.tokens + generated)
            else:  # cancelled before the prompt was in: keep the reused prefix only
                pool.release(slot, None)
            self.metrics.add_request(
                prompt_n=t.prompt_n,
                cache_n=t.cache_n,
                prompt_ms=t.prompt_ms,
                predicted=t.predicted_n,
                predicted_ms=t.predicted_ms,
                steps=steps,
                busy_slot_steps=busy,
                draft_n=t.draft_n,
                accepted=t.draft_accepted,
                drafts=drafts,
                per_pos=per_pos,
            )

    def _law(self, job: Job, context: int) -> model.Drafter:
        acceptance = model.acceptance(self.preset, context, job.kind, job.latent)
        return model.drafter(self.preset, acceptance, job.draft, job.kind)

    def _publish_overhead(
        self, slot: Slot, law: model.Drafter, draft: DraftSettings, context: int
    ) -> None:
        """Tell the pool what this request adds to the shared step (in an MTP process)."""
        if self.draft.enabled:
            drafting = model.expected_step(law, draft).drafted
            overhead = model.speculative_overhead(self.preset, draft, self.draft, context, drafting)
            self.pool.set_overhead(slot, overhead)

    def _step_ms(self, slot: Slot, draft: DraftSettings, context: int, drafted: int) -> float:
        """One step of this slot, shared with every slot decoding now (MODEL.md)."""
        pool, process = self.pool, self.draft
        neighbours = None  # no speculation in the process: nothing to share or mix
        if process.enabled:
            others = max(0.0, pool.overhead_sum - slot.overhead)
            neighbours = model.Neighbours(pool.n_decoding - 1, others, pool.n_depths - 1)
        return model.step_ms(
            self.preset, draft, context, drafted, pool.n_decoding, process, neighbours
        )

    def _neighbours(self, draft: DraftSettings) -> model.Neighbours:
        """The requests decoding now, as seen by one more at `draft`'s depth."""
        pool, depth = self.pool, _depth(draft)
        depths = pool.n_depths + (0 if pool.has_depth(depth) else 1)
        return model.Neighbours(pool.n_decoding, pool.overhead_sum, depths - 1)

    def predict(
        self,
        prompt: Prompt,
        max_tokens: int | None,
        ignore_eos: bool,
        draft: DraftSettings | None = None,
        concurrent: int | None = None,
        depth: int | None = None,
    ) -> dict[str, Any]:
        """Expected figures of a request on this server (its caches, its load), not run.

        `draft` replaces the process's start-up settings; `depth` is the request's own
        "speculative.n_max" within them.
        """
        job = self.job(prompt, max_tokens, ignore_eos)
        cached = min(self.pool.best_prefix(job.tokens), len(job.tokens) - 1)
        process = self.draft if draft is None else draft
        settings = request_draft(process, depth)
        if concurrent is None:  # this server's load as it is: who decodes, at which depths
            n, neighbours = self.pool.n_decoding + 1, self._neighbours(settings)
        else:  # a hypothetical load: the others draft as this one
            n, neighbours = max(1, concurrent), None
        pred = model.predict(
            self.preset,
            settings,
            len(job.tokens),
            cached,
            job.kind,
            job.latent,
            job.limit,
            n,
            process,
            neighbours,
        )
        return {
            "prompt_tokens": len(job.tokens),
            "cache_n": cached,
            "prompt_n": len(job.tokens) - cached,
            "output_tokens": job.limit,
            "concurrent": n,
            "prefill_s": pred.prefill_s,
            "decode_tok_s": pred.decode_tok_s,
            "acceptance": pred.acceptance,
            "total_s": pred.total_s,
            "draft": {
                "spec_type": settings.spec_type,
                "n_max": settings.n_max,
                "n_min": settings.n_min,
                "p_min": settings.p_min,
            },
        }
