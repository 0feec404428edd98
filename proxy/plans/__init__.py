"""How each model is served (its plan: one process, pool or single), whether the backends fit
in GPU memory, and adopting plans at start-up, reload and auto's fallback."""
