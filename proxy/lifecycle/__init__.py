"""The process's life: systemd's notifications, fail-fast, reload, drain, the learned file."""
