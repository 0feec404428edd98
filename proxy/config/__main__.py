"""`python -m proxy.config`: print the configuration reference (docs/configuration.md)."""

from proxy.config.reference import render_reference

print(render_reference(), end="")
