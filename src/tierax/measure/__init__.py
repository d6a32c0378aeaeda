"""Measuring what really happens: gradient equivalence (``verify``), profiler traces
(``trace``: compute, host↔device transfers and their overlap) and runtime memory
(``memory``)."""
