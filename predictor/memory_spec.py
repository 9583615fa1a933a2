"""One plan's memory from one JSON object: the ``frenzy memory`` / ``POST /v1/memory`` body.

A spec names the model (catalog name or dimensions), the training configuration, the plan
(tp, pp, dp, micro-batch, recompute, ZeRO), the runtime profile with its per-job overrides
(dropout, activation, explicit layers per stage) and the GPU type, and gets back the three
memory figures (tensors, reserved, device) with their breakdown. Every unknown key is an
error naming it; README.md ("Memory estimate") lists the fields.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, fields
from typing import Any

from predictor.errors import SpecError
from predictor.gpus import GpuType, resolve_gpu
from predictor.memory import MemoryBreakdown, estimate_memory, megatron_chunk_layers
from predictor.overhead import NON_TENSOR, NonTensorModel
from predictor.runtimes import DEFAULT_RUNTIME, EXECUTION_FIELDS, RuntimeProfile, get_runtime
from predictor.spec import ModelSpec, ParallelConfig, Recompute, TrainingSpec

MODEL_FIELDS = ("name", "family", "num_layers", "hidden_size", "num_heads", "num_kv_heads",
                "head_dim", "ffn_hidden_size", "vocab_size", "max_seq_len", "tie_embeddings",
                "type_vocab_size", "activation")
TRAIN_FIELDS = ("global_batch", "seq_len", "precision", "optimizer")
PLAN_FIELDS = ("tp", "pp", "dp", "micro_batch", "recompute", "zero_stage",
               "sequence_parallel", "flash_attention")
RUNTIME_OPTIONS = tuple(f.name for f in fields(RuntimeProfile)
                        if f.name not in ("name", "description", *EXECUTION_FIELDS))
SPLIT_FIELDS = ("account_for_embedding_in_pipeline_split",
                "account_for_loss_in_pipeline_split")
"""Megatron's ``--account-for-{embedding,loss}-in-pipeline-split``: the embedding / the loss
counts as a layer when the layers are split over the stages and virtual chunks
(``predictor.memory.megatron_chunk_layers``)."""
SPEC_FIELDS = ("model", "hf_config", *TRAIN_FIELDS, *PLAN_FIELDS, "cp", "dropout",
               "activation", "layers_per_stage", "virtual_stages", "runtime",
               "runtime_options", "gpu", "stage", *SPLIT_FIELDS)


@dataclass(frozen=True, slots=True)
class MemoryRequest:
    """A parsed spec: everything ``estimate_memory`` and the non-tensor terms need."""

    model: ModelSpec
    train: TrainingSpec
    par: ParallelConfig
    runtime: RuntimeProfile
    gpu: GpuType | None
    layers: tuple[int, ...] | None = None
    virtual_stages: int = 1
    stage: str | int = "worst"  # "worst", "first", "last" or a stage index
    chunks: tuple[tuple[int, ...], ...] | None = None  # per stage, layers per virtual chunk


def _unknown(where: str, key: str, allowed: tuple[str, ...]) -> SpecError:
    close = difflib.get_close_matches(key, allowed, n=2)
    hint = f" (did you mean {', '.join(close)}?)" if close else ""
    return SpecError(f"{where}{key}", f"unknown field{hint}; known: {', '.join(allowed)}")


def _model(raw: Any, activation: str | None, seq_len: int) -> ModelSpec:
    if isinstance(raw, str):
        model = ModelSpec.from_name(raw)
    elif isinstance(raw, dict):
        for key in raw:
            if key not in MODEL_FIELDS:
                raise _unknown("model.", key, MODEL_FIELDS)
        body = dict(raw)
        body.setdefault("name", "custom")
        if "family" not in body:
            raise SpecError("model.family", "required for explicit dimensions "
                            "(gpt2, llama, qwen2, qwen3, gpt_neox, bert)")
        body.setdefault("max_seq_len", seq_len)
        try:
            model = ModelSpec.from_dict(body)
        except TypeError as exc:
            raise SpecError("model", str(exc)) from None
    else:
        raise SpecError("model", "a catalog name or an object of dimensions is required")
    if activation:
        model = model.with_(activation=activation)
    return model


def _hf_model(config: Any, activation: str | None) -> ModelSpec:
    """The model of a Hugging Face ``config.json`` object (``ModelSpec.from_hf_config``);
    its errors name the field under ``hf_config``."""
    try:
        model = ModelSpec.from_hf_config(config)
    except SpecError as exc:
        field = exc.field.removeprefix("config")
        raise SpecError(f"hf_config{field}", exc.reason) from None
    return model.with_(activation=activation) if activation else model


def _context_parallel_share(spec: dict[str, Any]) -> dict[str, Any]:
    """``cp`` context-parallel ranks (Megatron's ``--context-parallel-size``) as one rank's
    share: each rank holds ``seq_len / cp`` tokens of every sequence, and the ZeRO shards
    (the distributed optimizer's) spread over ``dp · cp`` ranks; the micro-batches per step
    are unchanged. The spec's ``dp`` stays the data-parallel degree without cp."""
    cp = spec.get("cp", 1)
    if isinstance(cp, bool) or not isinstance(cp, int) or cp < 1:
        raise SpecError("cp", f"a positive integer (context-parallel ranks), got {cp!r}")
    if cp == 1:
        return spec
    s, dp, batch = spec["seq_len"], spec.get("dp", 1), spec["global_batch"]
    if isinstance(s, bool) or not isinstance(s, int) or s % cp:
        raise SpecError("cp", f"cp={cp} must divide seq_len={s!r}; choose a cp that does")
    for key, value in (("dp", dp), ("global_batch", batch)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise SpecError(key, f"an integer, got {value!r}")
    return {**spec, "seq_len": s // cp, "dp": dp * cp, "global_batch": batch * cp}


FUSED_OPTIMIZERS = frozenset({"adamw_torch_fused", "fusedadam", "adamw_apex_fused"})
"""Optimizer spellings of fused Adam kernels (torch ``fused=True``, apex / DeepSpeed
``FusedAdam``): they update in place, with no foreach temporary (``optimizer_fused``)."""


def _fused_optimizer(name: Any) -> bool:
    """Whether the spec's ``optimizer`` spelling names a fused Adam kernel."""
    if not isinstance(name, str):
        return False
    key = name.strip().lower().rsplit(".", 1)[-1].replace("-", "_")
    return key in FUSED_OPTIMIZERS


def parse_memory_spec(spec: Any) -> MemoryRequest:
    """Validate one spec object; ``SpecError`` names the first bad field."""
    if not isinstance(spec, dict):
        raise SpecError("spec", f"must be a JSON object, got {type(spec).__name__}")
    for key in spec:
        if key not in SPEC_FIELDS:
            raise _unknown("", key, SPEC_FIELDS)
    if "model" in spec and "hf_config" in spec:
        raise SpecError("hf_config", "give either model or hf_config, not both")
    if "model" not in spec and "hf_config" not in spec:
        raise SpecError("model", "required: a catalog name or an object of dimensions "
                                 "(or hf_config: a Hugging Face config.json object)")
    for key in ("global_batch", "seq_len"):
        if key not in spec:
            raise SpecError(key, "required")
    spec = _context_parallel_share(spec)
    if "hf_config" in spec:
        model = _hf_model(spec["hf_config"], spec.get("activation"))
    else:
        model = _model(spec["model"], spec.get("activation"), spec["seq_len"])
    plan = {k: spec[k] for k in PLAN_FIELDS if k in spec}
    train = TrainingSpec(
        **{k: spec[k] for k in TRAIN_FIELDS if k in spec},
        flash_attention=bool(plan.get("flash_attention", True)),
        sequence_parallel=bool(plan.get("sequence_parallel", False)))
    train.check_against(model)
    par = ParallelConfig(**plan)
    par.check(model, train, explicit_split=spec.get("layers_per_stage") is not None
              or any(spec.get(k) is True for k in SPLIT_FIELDS))

    # a runtime that runs the model's own code keeps the dropouts its config sets; an
    # explicit ``dropout`` or ``runtime_options`` below still wins
    runtime = get_runtime(spec.get("runtime", DEFAULT_RUNTIME)).for_model(model)
    options = spec.get("runtime_options") or {}
    if not isinstance(options, dict):
        raise SpecError("runtime_options", "must be an object of profile fields")
    for key in options:
        if key not in RUNTIME_OPTIONS:
            raise _unknown("runtime_options.", key, RUNTIME_OPTIONS)
    if spec.get("dropout") is not None:
        p = spec["dropout"]
        if isinstance(p, bool) or not isinstance(p, int | float) or not 0 <= p < 1:
            raise SpecError("dropout", f"a probability in [0, 1), got {p!r}")
        options = {"hidden_dropout": p > 0, "attention_dropout": p > 0, **options}
    if _fused_optimizer(spec.get("optimizer")):
        options = {"optimizer_fused": True, **options}
    if options:
        runtime = runtime.with_overrides(**options)
    runtime.check_runs(model, train.optimizer.value)
    _check_memory_flags(runtime, model, train, par)

    vstages = spec.get("virtual_stages", 1)
    if isinstance(vstages, bool) or not isinstance(vstages, int) or vstages < 1:
        raise SpecError("virtual_stages", f"a positive integer, got {vstages!r}")
    layers = spec.get("layers_per_stage")
    chunks = _chunk_layers(spec, model, par.pp, vstages)
    if chunks is not None:
        layers = None
    elif layers is not None:
        if (not isinstance(layers, list) or len(layers) != par.pp
                or not all(isinstance(n, int) and n >= 0 for n in layers)
                or sum(layers) != model.num_layers):
            raise SpecError("layers_per_stage",
                            f"a list of pp={par.pp} layer counts summing to "
                            f"num_layers={model.num_layers}, got {layers!r}")
        layers = tuple(layers)
    if vstages > 1 and chunks is None:
        per = layers or (model.num_layers // par.pp,) * par.pp
        if any(n % vstages for n in per):
            raise SpecError("virtual_stages",
                            f"{vstages} must divide every stage's layers {list(per)}")
    stage = spec.get("stage", "worst")
    if stage not in ("worst", "first", "last") and not (
            isinstance(stage, int) and not isinstance(stage, bool) and 0 <= stage < par.pp):
        raise SpecError("stage", f"worst, first, last or a stage index below pp={par.pp}, "
                        f"got {stage!r}")
    gpu = resolve_gpu(spec["gpu"]) if spec.get("gpu") else None
    return MemoryRequest(model, train, par, runtime, gpu, layers, vstages, stage, chunks)


def _chunk_layers(spec: dict[str, Any], model: ModelSpec, pp: int, vstages: int
                  ) -> tuple[tuple[int, ...], ...] | None:
    """The layers of each virtual chunk of each stage where a spec gives uneven chunks:
    ``layers_per_stage`` as pp lists of ``virtual_stages`` counts, or Megatron's
    embedding / loss accounting (``SPLIT_FIELDS``); None for the plain forms."""
    flags = {}
    for key in SPLIT_FIELDS:
        value = spec.get(key, False)
        if not isinstance(value, bool):
            raise SpecError(key, f"true or false, got {value!r}")
        flags[key] = value
    layers = spec.get("layers_per_stage")
    nested = isinstance(layers, list) and any(isinstance(n, list) for n in layers)
    if any(flags.values()):
        named = SPLIT_FIELDS[0] if flags[SPLIT_FIELDS[0]] else SPLIT_FIELDS[1]  # for errors
        if layers is not None:
            raise SpecError(named, "derives the split itself; give it or layers_per_stage, "
                            "not both")
        try:
            return megatron_chunk_layers(model.num_layers, pp, vstages,
                                         embedding=flags[SPLIT_FIELDS[0]],
                                         loss=flags[SPLIT_FIELDS[1]])
        except ValueError as exc:
            raise SpecError(named, str(exc)) from None
    if not nested:
        return None
    if (len(layers) != pp or vstages < 2
            or not all(isinstance(c, list) and len(c) == vstages for c in layers)
            or not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0
                       for c in layers for n in c)
            or sum(map(sum, layers)) != model.num_layers):
        raise SpecError("layers_per_stage",
                        f"per virtual chunk: pp={pp} lists of virtual_stages={vstages} layer "
                        f"counts (virtual_stages > 1) summing to num_layers="
                        f"{model.num_layers}, got {layers!r}")
    return tuple(tuple(c) for c in layers)


def _check_memory_flags(rt: RuntimeProfile, model: ModelSpec, train: TrainingSpec,
                        par: ParallelConfig) -> None:
    """``SpecError`` for torchtune flags outside what their counts were derived for."""
    where = "runtime_options."
    if rt.loss_chunks and not rt.compiled:
        raise SpecError(f"{where}loss_chunks", "priced with torchtune's compiled loss only; "
                        "add \"compiled\": true (or drop loss_chunks)")
    if rt.compiled:
        if not (model.rmsnorm and model.swiglu) or model.qk_norm:
            raise SpecError(f"{where}compiled", "derived for llama-style layers (RMSNorm, "
                            "SwiGLU, no q/k norm: families llama, qwen2); drop it for "
                            f"{model.family.value}")
        if not (par.flash_attention and train.flash_attention):
            raise SpecError(f"{where}compiled", "derived with SDPA flash attention; set "
                            "flash_attention to true")
        if rt.hidden_dropout or rt.attention_dropout:
            raise SpecError(f"{where}compiled", "derived without dropout; set dropout to 0")
        if par.recompute is Recompute.SELECTIVE:
            raise SpecError(f"{where}compiled", "recompute none or full (torchtune's "
                            "activation checkpointing), not selective")
    if rt.optimizer_in_backward and rt.grads_set_to_none:
        raise SpecError(f"{where}optimizer_in_backward",
                        f"not priced with runtime {rt.name}'s step-by-step gradient moments "
                        "(grads_set_to_none); name torchtune or hf-trainer")
    if rt.optimizer_in_backward and par.micro_batches(train.global_batch) > 1:
        raise SpecError(f"{where}optimizer_in_backward",
                        "needs one micro-batch per step (gradient accumulation 1): set "
                        "global_batch to micro_batch·dp")


def estimate_request(req: MemoryRequest, non_tensor: NonTensorModel = NON_TENSOR
                     ) -> MemoryBreakdown:
    """The breakdown of the requested stage with the non-tensor terms filled in."""
    pp = req.par.pp
    stages = {"first": (0,), "last": (pp - 1,)}.get(req.stage) if isinstance(req.stage, str) \
        else (req.stage,)
    mem = estimate_memory(req.model, req.train, req.par, runtime=req.runtime,
                          layers=req.layers, virtual_stages=req.virtual_stages, stages=stages,
                          chunks=req.chunks)
    return non_tensor.fill(mem, req.gpu, req.par.num_gpus)


def memory_report(spec: Any, non_tensor: NonTensorModel = NON_TENSOR) -> dict[str, Any]:
    """The ``frenzy memory`` answer for one spec object (``SpecError`` on bad input)."""
    try:
        req = parse_memory_spec(spec)
    except SpecError:
        raise
    except (TypeError, ValueError, OverflowError) as exc:  # a value of the wrong JSON type
        raise SpecError("spec", f"invalid value: {exc}") from None
    mem = estimate_request(req, non_tensor)
    out: dict[str, Any] = {
        "tensors_bytes": mem.tensors,
        "reserved_bytes": mem.reserved,
        "device_bytes": mem.device,
        "breakdown": {
            "parameters": mem.parameters, "gradients": mem.gradients,
            "optimizer_states": mem.optimizer_states, "activations": mem.activations,
            "logits": mem.logits, "transient": mem.transient, "workspace": mem.workspace,
            "allocator_slack": mem.slack, "outside_allocator": mem.overhead,
            "stage": mem.stage},
        "runtime": req.runtime.name,
        "gpu": req.gpu.name if req.gpu else None,
    }
    if mem.paged:  # paged 8-bit optimizer states: device figure only
        out["breakdown"]["paged_optimizer_states"] = mem.paged
    if req.gpu is not None:
        out["gpu_memory_bytes"] = req.gpu.memory_bytes
        out["fits"] = mem.device <= req.gpu.memory_bytes
    return out
