"""Persistence: engine/session helpers, models and repository functions."""
