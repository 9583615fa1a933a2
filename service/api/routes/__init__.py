"""Route modules, one per resource; each exposes ``router``."""
