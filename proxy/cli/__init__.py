"""The command line: ``mtp-proxy`` (``main``) and the commands that are not the service itself."""
