"""Scheduler: cluster state, allocations, decisions and the policies (pure, no I/O)."""
