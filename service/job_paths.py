"""Paths in a job file: relative ones are read against the file's folder."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def resolve_relative_paths(body: dict[str, Any], base: Path) -> dict[str, Any]:
    """``body`` with relative ``data.path``, ``data.tokenizer``, ``init_from`` and
    ``working_dir`` made
    absolute against ``base`` (a job file's folder): the service may run elsewhere."""
    out = dict(body)

    def absolute(value: Any) -> Any:
        if isinstance(value, str) and value and not Path(value).expanduser().is_absolute():
            return str((base / value).resolve())
        return str(Path(value).expanduser()) if isinstance(value, str) and value else value

    for key in ("init_from", "working_dir"):
        if key in out:
            out[key] = absolute(out[key])
    data = out.get("data")
    if isinstance(data, dict):
        out["data"] = {**data, **{k: absolute(data[k]) for k in ("path", "tokenizer")
                                  if k in data}}
    return out
