"""Backend implementations: ``sim`` (virtual clock); the Ray backend lives beside it."""
