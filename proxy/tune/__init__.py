"""`mtp-proxy tune`: measure candidate draft settings on this machine, recommend profiles.

grid (candidate settings) -> where to measure: through the running service (service, service_job,
service_run) or on tune's own processes (guard, own_job, runner, launch) -> context (the
server's real context) -> workload (what is replayed, sized to it) -> plan, estimate -> record,
measure, failures -> store (resumable results) -> analysis (the router's classes, median and
spread) -> recommend (fewest profiles, a seeded learned file) -> summary, outputs, chart ->
apply. The command line is in ``command``; the map of every module is in ``proxy/__init__.py``.
"""
