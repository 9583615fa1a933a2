"""A submission's inputs on disk: its data and its ``init_from`` weights.

``check_inputs`` runs at submission (the files exist and are readable, the tokenizer loads and
fits the model's vocabulary, the corpus makes at least one sample, how many epochs the steps
read) and answers 422 naming the field; ``init_from_spec`` reads the model of an ``init_from``
folder. ``trainer_options`` turns a stored request into the built-in trainer's options (the
defaults resolved), the JSON the runtime hands to the backend in ``JobView.extra["trainer"]``
(applied by ``orchestrator.trainer.loop.apply_options``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from predictor.spec import ModelSpec, TrainingSpec
from service.api.errors import ApiError
from service.schemas import DataCreate, JobCreate

DEFAULT_LR_SYNTHETIC = 3e-3
DEFAULT_LR_DATA = 3e-4
DEFAULT_LR_FINETUNE = 3e-5


def data_config(body: JobCreate) -> Any:
    """The trainer's ``DataConfig`` of a body (synthetic when none is given)."""
    from orchestrator.trainer.data import TEXT_SUFFIXES, DataConfig, source_files

    d = body.data
    if not isinstance(d, DataCreate):
        return DataConfig()
    try:
        files = source_files(d.path)
    except ValueError:  # reported with its field by check_inputs
        files = []
    text = bool(files) and files[0].suffix in TEXT_SUFFIXES
    tokenizer = d.tokenizer or (body.init_from if text else None)
    return DataConfig(kind="text" if text else "tokens", path=d.path, tokenizer=tokenizer,
                      dtype=d.dtype, text_field=d.text_field, shuffle=d.shuffle)


def init_from_spec(body: JobCreate) -> tuple[ModelSpec, Any]:
    """The model and numerics of ``body.init_from``; 422 on ``init_from`` if unusable."""
    from orchestrator.trainer.hf import spec_from_folder, weight_files
    from predictor.errors import SpecError

    assert body.init_from
    try:
        spec, numerics = spec_from_folder(body.init_from)
        weight_files(body.init_from)
    except SpecError as exc:
        raise ApiError(422, "init_from", f"{body.init_from}: config.json: {exc.field}: "
                       f"{exc.reason}") from None
    except ValueError as exc:
        raise ApiError(422, "init_from", str(exc)) from None
    return spec, numerics


def check_init_from(body: JobCreate, model: ModelSpec) -> None:
    """The model given alongside ``init_from`` must be the folder's."""
    spec, _ = init_from_spec(body)
    fields = ("family", "num_layers", "hidden_size", "num_heads", "num_kv_heads", "head_dim",
              "ffn_hidden_size", "vocab_size", "tie_embeddings")
    diff = [f"{f} {getattr(model, f)} vs {getattr(spec, f)}" for f in fields
            if getattr(model, f) != getattr(spec, f)]
    if diff:
        raise ApiError(422, "init_from", f"the model given differs from {body.init_from}'s "
                       f"config.json ({'; '.join(diff)}); leave the model out to use the "
                       "folder's")


def check_inputs(body: JobCreate, model: ModelSpec, train: TrainingSpec) -> list[str]:
    """Validate the body's files against its model and steps; notes for the response.
    Raises ``ApiError`` 422 naming the field (``data.path``, ``data.tokenizer``, ...)."""
    from orchestrator.trainer.data import DataError, summarize

    notes: list[str] = []
    if body.init_from:
        check_init_from(body, model)
    cfg = data_config(body)
    if cfg.synthetic:
        return notes
    try:
        summary = summarize(cfg, seq_len=train.seq_len, global_batch=train.global_batch,
                            steps=train.num_steps)
    except DataError as exc:
        raise ApiError(422, exc.field, exc.reason) from None
    if summary.vocab_size is not None and summary.vocab_size > model.vocab_size:
        field = "data.tokenizer" if cfg.kind == "text" else "data.path"
        what = ("the tokenizer's vocabulary has" if cfg.kind == "text"
                else "the largest token id is")
        size = summary.vocab_size if cfg.kind == "text" else summary.vocab_size - 1
        raise ApiError(422, field, f"{what} {size:,} entries/ids, beyond the model's "
                       f"vocab_size {model.vocab_size:,}; use the model's tokenizer or a "
                       "model with a larger vocabulary")
    notes.append(summary.note)
    return notes


def trainer_options(request: Mapping[str, Any], total_steps: int) -> dict[str, Any]:
    """The built-in trainer's options of a stored request (JSON), every default resolved."""
    body = JobCreate.model_validate(dict(request))
    t = body.training
    cfg = data_config(body)
    synthetic = cfg.synthetic
    default_lr = (DEFAULT_LR_FINETUNE if body.init_from else
                  DEFAULT_LR_SYNTHETIC if synthetic else DEFAULT_LR_DATA)
    return {
        "lr": t.lr if t.lr is not None else default_lr,
        "lr_schedule": t.lr_schedule or "cosine",
        "warmup_steps": (t.warmup_steps if t.warmup_steps is not None
                         else min(1000, total_steps // 20)),
        "min_lr_ratio": t.min_lr_ratio if t.min_lr_ratio is not None else 0.1,
        "weight_decay": t.weight_decay if t.weight_decay is not None else 0.1,
        "grad_clip": t.grad_clip if t.grad_clip is not None else 1.0,
        "seed": t.seed or 0,
        "data": None if synthetic else {
            "kind": cfg.kind, "path": cfg.path, "tokenizer": cfg.tokenizer,
            "dtype": cfg.dtype, "text_field": cfg.text_field, "shuffle": cfg.shuffle},
        "init_from": body.init_from,
    }

