"""The workload library shared by ``tune`` and ``bench``: the trace format and the texts."""
