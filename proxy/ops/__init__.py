"""Operating the proxy: logs, metrics, the admin endpoints and ``mtp-proxy status``, reload on
SIGHUP, graceful drain, systemd notifications. The map is in ``proxy``."""
