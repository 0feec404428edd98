"""The configuration: one home for the schema of every setting, in one pydantic style.

Every field is `Field(default=..., description="...")`: the description's first sentence is the
one line config.toml shows beside the key, and the whole of it is the docs table's meaning.
Validators are named for what they check.

- settings.py   `Settings`, the root (MTP_PROXY_* environment overrides), the `[server]`, `[log]`
                and `[compat]` tables, `[[models]]` with `[[models.profiles]]`, and
                `load_settings` (TOML file or the embedded default, readable `ConfigError`)
- routing.py    `[routing]`: the routing policy's thresholds and priors
- model_names.py  `[model_names]`: names clients send -> the model that serves them
- reference.py  the reference rendered from the schema (`python -m proxy.config`), which is
                docs/configuration.md
- default.toml  the embedded default: the simulated demo model

`[supervisor]` is `supervisor.settings.SupervisorSettings`, written in the same style but kept in
the supervisor package: the supervisor never imports the proxy. `Settings` embeds it.
"""
