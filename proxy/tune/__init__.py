"""`mtp-proxy tune`: measure candidate draft settings on this machine, recommend profiles.

grid (candidate settings) -> workload (what is replayed) -> runner/launch/measure (one process
at a time, or depths per request) -> store (resumable results) -> analysis (the router's
classes, median and spread) -> recommend (fewest profiles, seeded routing state) -> outputs,
chart. The command line is in ``command``.
"""
