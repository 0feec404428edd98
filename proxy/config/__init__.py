"""The configuration: Settings (server, models, log, supervisor) and the ``[routing]`` section;
``default.toml`` is the embedded demo configuration."""
