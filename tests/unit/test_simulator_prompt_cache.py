"""The simulator's host-memory prompt cache, as llama-server's --cache-ram (on by default): a slot
that another prompt takes is saved first, and its state comes back when its own prompt does
(over HTTP, and the flag: tests/simulator/test_simulator_prompt_cache.py)."""

from __future__ import annotations

from simulator.slots import HostCache, SlotPool

AGENT = list(range(1000, 9000))  # an agent's context: 8,000 tokens
CHAT = [1, 2, 3, 4, 5]


def _host(limit: float = -1.0) -> HostCache:
    return HostCache(limit, bytes_per_token=1.0, state_bytes=0.0)


async def _turn(pool: SlotPool, tokens: list[int], answer: int = 50) -> tuple[int, int]:
    """One request on the pool: (slot id, tokens its state was restored with)."""
    slot = await pool.acquire(tokens)
    restored = slot.restored
    pool.release(slot, tokens + list(range(-answer, 0)))
    return slot.id, restored


async def test_a_chat_that_takes_an_agents_slot_leaves_its_context_in_host_memory() -> None:
    pool = SlotPool(1, _host())
    await _turn(pool, AGENT)
    await _turn(pool, CHAT)  # the only slot: LRU, the agent's state is saved first
    slot = await pool.acquire([*AGENT, *range(-50, 0), 7, 7, 7])
    assert slot.restored == len(AGENT) + 50  # the whole first turn came back
    assert slot.cache[: len(AGENT)] == AGENT


async def test_without_the_host_cache_the_agent_prefills_again() -> None:
    pool = SlotPool(1, None)
    await _turn(pool, AGENT)
    await _turn(pool, CHAT)
    slot = await pool.acquire([*AGENT, 7])
    assert slot.restored == 0
    assert slot.cache[:5] == CHAT  # what the chat left: the agent's context is gone


async def test_the_oldest_saved_state_goes_first_and_an_oversized_one_is_not_saved() -> None:
    host = _host(limit=20_000)
    pool = SlotPool(1, host)
    first, second = list(range(0, 9000)), list(range(50_000, 59_000))
    await _turn(pool, first, answer=0)
    await _turn(pool, second, answer=0)  # saves first (9,000)
    await _turn(pool, CHAT, answer=0)  # saves second: 18,000 in all
    await _turn(pool, list(range(80_000, 89_000)), answer=0)  # the chat: 18,005
    await _turn(pool, list(range(100_000, 125_000)), answer=0)  # 9,000 more: the first goes
    assert [s[0] for s in host.states] == [50_000, 1, 80_000]
    host.save(list(range(200_000, 230_000)))  # 30,000: over the whole limit
    assert all(s[0] != 200_000 for s in host.states)


def test_a_saved_state_is_loaded_only_if_it_reuses_more_of_both_prompt_and_itself() -> None:
    host = _host()
    host.save(AGENT)
    # a prompt sharing only the first 1,000 tokens: a quarter of the state is not reused
    assert host.load([], AGENT[:1000] + [0] * 10) is None
    # the slot's own cache: 6,000 tokens of the agent, then another answer
    assert host.load([*AGENT[:6000], *[9] * 100], [*AGENT, 1]) == AGENT
    assert not host.states  # taken out: it lives in the slot now


async def test_what_predict_assumes_reused_counts_the_host_cache() -> None:
    """/sim/predict (the greedy reference) must see the agent's context as reused once a chat
    took its slot, as the next turn will find it."""
    pool = SlotPool(1, _host())
    await _turn(pool, AGENT, answer=0)
    await _turn(pool, CHAT, answer=0)
    assert pool.best_prefix([*AGENT, 7]) == len(AGENT)
    assert SlotPool(1, None).best_prefix(AGENT) == 0


def test_the_cache_keeps_what_its_states_weigh() -> None:
    host = _host(limit=20_000)
    for start in (0, 50_000, 100_000):
        host.save(list(range(start, start + 9000)))
    assert len(host.states) == 2 and host.size == 18_000  # the first went for the third
    assert host.load([], list(range(100_000, 109_001))) is not None
    assert host.size == sum(host.weight(t) for t in host.states) == 9000


async def test_idle_slots_are_saved_at_each_new_task() -> None:
    host = _host()
    pool = SlotPool(2, host, save_idle=True)
    await _turn(pool, AGENT, answer=0)
    await _turn(pool, CHAT, answer=0)  # the agent's slot is idle at this launch
    assert AGENT in host.states
