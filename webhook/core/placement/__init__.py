"""Where a GPU pod goes: node classes, topology, fit, the workload mix, fragmentation, scoring, choice."""
