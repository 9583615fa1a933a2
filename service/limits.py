"""Input limits of the API: what a request may carry before the service does work for it.

Everything here is pure (no I/O) and shared by the request schemas (``service.schemas``) and
the planning step (``service.api.planning``):

* ``check_text``: strings the databases can store. PostgreSQL refuses a NUL character in
  any text value and neither database stores a lone UTF-16 surrogate; both are refused
  with a 422 naming the field instead of a driver error (a 500).
* ``check_json_document``: the shape of a free-form JSON object (``hf_config``): nesting
  depth, number of entries and the same string rule, walked with an explicit stack (no
  recursion: a deep document cannot exhaust the interpreter's stack here).
* ``MODEL_BOUNDS`` / ``check_model_bounds``: the range of every model dimension the
  planner is asked about, applied to the resolved model whether it came as ``dimensions``
  or as an ``hf_config`` (whose numbers no schema field sees).
* ``check_planner_range``: the planner computes per-GPU bytes in 64-bit integers; the
  largest of them (the whole global batch as one micro-batch, one GPU, nothing recomputed)
  must stay below ``MAX_PLANNER_BYTES``, which leaves a factor of 4 for the pipeline's
  micro-batches in flight. Each field's bound alone cannot guarantee that (batch ×
  sequence² × heads × layers without flash attention), so the product is checked too.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

MAX_HF_CONFIG_DEPTH = 16
"""Nesting depth of an ``hf_config`` object (Hugging Face configs nest 2–4 deep)."""
MAX_HF_CONFIG_ENTRIES = 4096
"""Keys and list items of an ``hf_config``, counted over every level."""
MAX_PLANNER_BYTES = 1 << 61
"""Largest per-GPU byte count the planner is asked to hold in a 64-bit integer."""

MODEL_BOUNDS: dict[str, int] = {
    "num_layers": 1024,
    "hidden_size": 1 << 16,
    "num_heads": 1024,
    "num_kv_heads": 1024,
    "vocab_size": 1 << 22,
    "max_seq_len": 1 << 21,
    "ffn_hidden_size": 1 << 19,
    "type_vocab_size": 1 << 16,
    "head_dim": 1 << 16,
}
"""Upper bound of each model dimension (the schema's ``le``); generous for today's models
(the largest public ones have ~128 layers, hidden 25,600, 256k vocabularies)."""


def text_problem(value: str) -> str | None:
    """Why ``value`` cannot be stored (None if it can)."""
    if "\x00" in value:
        return "must not contain the NUL character (\\u0000)"
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return "must be valid Unicode (a lone surrogate \\ud800-\\udfff was given)"
    return None


def check_text(value: str) -> str:
    """``value`` if both databases can store it; ``ValueError`` saying why not."""
    problem = text_problem(value)
    if problem is not None:
        raise ValueError(problem)
    return value


def check_json_document(
    value: Mapping[str, Any],
    *,
    max_depth: int = MAX_HF_CONFIG_DEPTH,
    max_entries: int = MAX_HF_CONFIG_ENTRIES,
) -> Mapping[str, Any]:
    """``value`` if its depth, size and strings are within bounds; ``ValueError`` naming
    the first offending path otherwise."""
    entries = 0
    stack: list[tuple[str, Any, int]] = [("", value, 1)]
    while stack:
        path, node, depth = stack.pop()
        if isinstance(node, Mapping):
            items = [(f"{path}.{k}" if path else str(k), k, v) for k, v in node.items()]
        elif isinstance(node, list):
            items = [(f"{path}[{i}]", None, v) for i, v in enumerate(node)]
        else:
            if isinstance(node, str) and (problem := text_problem(node)) is not None:
                raise ValueError(f"{path or 'value'}: {problem}")
            continue
        if depth > max_depth:
            raise ValueError(f"{path}: nested deeper than {max_depth} levels")
        entries += len(items)
        if entries > max_entries:
            raise ValueError(f"more than {max_entries} keys and list items in all")
        for child_path, key, child in items:
            if isinstance(key, str) and (problem := text_problem(key)) is not None:
                raise ValueError(f"{child_path}: key {problem}")
            stack.append((child_path, child, depth + 1))
    return value


def model_bound_problem(values: Mapping[str, Any]) -> tuple[str, str] | None:
    """(field, why) for the first model dimension out of ``MODEL_BOUNDS``, else None.
    Booleans are refused where a number is expected (JSON ``true`` is not 1)."""
    for name, bound in MODEL_BOUNDS.items():
        v = values.get(name)
        if v is None:
            continue
        if isinstance(v, bool) or not isinstance(v, int):
            return name, f"must be an integer, got {type(v).__name__}"
        if v > bound:
            return name, f"must be at most {bound:,}, got {v:,}"
    return None


def planner_range_problem(peak_bytes: int) -> str | None:
    """Why a job whose largest per-GPU byte count is ``peak_bytes`` is out of the
    planner's range (None if it is within it)."""
    if peak_bytes <= MAX_PLANNER_BYTES:
        return None
    return (f"the whole global batch as one micro-batch would need {peak_bytes:.3g} bytes "
            f"on one GPU; the planner handles at most 2^61 ({MAX_PLANNER_BYTES:.3g}) bytes: "
            "lower global_batch or seq_len (or the model's dimensions)")
