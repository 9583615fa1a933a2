"""Errors raised by the predictor for bad input."""

from __future__ import annotations


class SpecError(ValueError):
    """A model, training or plan description is invalid.

    Carries the offending ``field`` so callers (CLI, API) can point at it, and a human
    ``reason`` that says what is wrong and, where possible, what would fit.
    """

    def __init__(self, field: str, reason: str) -> None:
        self.field = field
        self.reason = reason
        super().__init__(f"{field}: {reason}")
