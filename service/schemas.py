"""Request and response bodies of the REST API (pydantic), separate Create / Public models.

Create models check types and ranges (the messages name the field through its location);
the cross-field rules live in ``predictor.spec`` and reach the client as 422s through
``spec_error_field``, which maps a ``SpecError`` field onto the request's field path.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator

from orchestrator.states import JobState
from predictor.spec import Family, Optimizer, Precision
from service.limits import MODEL_BOUNDS, check_json_document, check_text

SafeStr = Annotated[str, AfterValidator(check_text)]
"""A string both databases can store (no NUL, no lone surrogate): a 422, not a 500."""

RETIRED_FIELDS: dict[str, str] = {
    "priority": "no longer accepted: no scheduling policy orders jobs by priority (each "
                "policy has its own order, see docs/security.md); remove the field",
}
"""Request fields that were removed, with the message a client that still sends one gets."""

# -- requests -----------------------------------------------------------------------------


class _Create(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ModelDimensions(_Create):
    """A model given by its numbers rather than by name (bounds: ``service.limits``)."""

    name: SafeStr = Field("custom", min_length=1, max_length=128)
    family: Family = Field(Family.LLAMA, description="layer structure")
    num_layers: int = Field(gt=0, le=MODEL_BOUNDS["num_layers"], strict=True)
    hidden_size: int = Field(gt=0, le=MODEL_BOUNDS["hidden_size"], strict=True)
    num_heads: int = Field(gt=0, le=MODEL_BOUNDS["num_heads"], strict=True)
    vocab_size: int = Field(gt=0, le=MODEL_BOUNDS["vocab_size"], strict=True)
    max_seq_len: int = Field(gt=0, le=MODEL_BOUNDS["max_seq_len"], strict=True)
    num_kv_heads: int = Field(0, ge=0, le=MODEL_BOUNDS["num_kv_heads"], strict=True,
                              description="0: same as num_heads")
    ffn_hidden_size: int = Field(0, ge=0, le=MODEL_BOUNDS["ffn_hidden_size"], strict=True,
                                 description="0: 4·hidden (GeLU)")
    tie_embeddings: bool = Field(True, strict=True)
    type_vocab_size: int = Field(0, ge=0, le=MODEL_BOUNDS["type_vocab_size"], strict=True)
    head_dim: int = Field(0, ge=0, le=MODEL_BOUNDS["head_dim"], strict=True,
                          description="one attention head's width (config.json's head_dim); "
                                      "0: hidden_size / num_heads")


class TrainingCreate(_Create):
    """How to train: global batch of ``seq_len``-token sequences, for steps or tokens.

    Numbers are strict (JSON ``true`` is not 1); the product of the batch and the model's
    size is bounded too (``service.limits.check_planner_range``, checked when planning)."""

    global_batch: int = Field(gt=0, le=1 << 20, strict=True,
                              description="sequences per optimizer step")
    seq_len: int = Field(gt=0, le=MODEL_BOUNDS["max_seq_len"], strict=True,
                         description="tokens per sequence")
    precision: Precision = Precision.BF16
    optimizer: Optimizer = Optimizer.ADAMW
    steps: int | None = Field(None, gt=0, le=1 << 40, strict=True)
    tokens: int | None = Field(None, gt=0, le=1 << 62, strict=True)
    flash_attention: bool = Field(True, strict=True)
    sequence_parallel: bool = Field(True, strict=True)
    lr: float | None = Field(
        None, gt=0, le=10, strict=True,
        description="peak learning rate (default: 3e-5 with init_from, 3e-4 on your data, "
                    "3e-3 on synthetic data)")
    lr_schedule: Literal["cosine", "linear", "constant"] | None = Field(
        None, description="decay after warmup (default cosine, down to min_lr_ratio·lr)")
    warmup_steps: int | None = Field(
        None, ge=0, le=1 << 40, strict=True,
        description="linear warmup steps (default: 5% of the steps, at most 1000)")
    min_lr_ratio: float | None = Field(None, ge=0, le=1, strict=True,
                                       description="final lr / lr (default 0.1)")
    weight_decay: float | None = Field(
        None, ge=0, le=10, strict=True,
        description="AdamW decoupled decay of the weight matrices (default 0.1)")
    grad_clip: float | None = Field(
        None, ge=0, le=1e6, strict=True,
        description="clip gradients to this global norm (default 1.0; 0: off)")
    seed: int | None = Field(
        None, ge=0, le=2**31 - 1, strict=True,
        description="initialisation, data order and masking (default 0)")


class DataCreate(_Create):
    """The job's training data: token shards, or text with a tokenizer."""

    path: SafeStr = Field(min_length=1, max_length=4096, description=(
        "a file or folder every worker can read: token shards (.bin raw uint16/uint32 ids, "
        ".npy 1-D arrays) or text (.txt documents, .jsonl with a text field)"))
    tokenizer: SafeStr | None = Field(None, min_length=1, max_length=4096, description=(
        "text data: a tokenizer.json (tokenizers library) or a model folder with one "
        "(default: init_from's)"))
    dtype: Literal["uint16", "uint32"] = Field("uint16", description=".bin token width")
    text_field: SafeStr = Field("text", min_length=1, max_length=128,
                            description="the document field of .jsonl lines")
    shuffle: bool = Field(True, strict=True, description="reshuffle the samples every epoch")


class JobCreate(_Create):
    """A model-only submission: exactly one of ``model`` (catalog name), ``hf_config``
    (a Hugging Face config.json object) or ``dimensions``, plus the training config.

    There is no ``priority``: no scheduling policy reads one (``RETIRED_FIELDS``)."""

    model: SafeStr | None = Field(None, min_length=1, max_length=128,
                                  examples=["llama-2-7b"])
    hf_config: dict[str, Any] | None = Field(
        None, description="Hugging Face config.json (at most 16 levels deep, 4096 entries)")
    dimensions: ModelDimensions | None = None
    training: TrainingCreate
    deadline_s: float | None = Field(None, gt=0, le=10 * 365 * 86400, strict=True,
                                     description="seconds from submission; refused (422) "
                                                 "when no plan can finish in time, unless "
                                                 "best_effort")
    max_runtime_s: float | None = Field(
        None, gt=0, le=10 * 365 * 86400, strict=True, allow_inf_nan=False,
        description="the most seconds the job may spend running (over restarts and "
                    "resizes); then it is stopped at a checkpoint and ends failed. Default "
                    "and maximum: the operator's max_runtime_s_default / max_runtime_s_max")
    best_effort: bool | None = Field(
        None, strict=True,
        description="true: accept a deadline_s no plan can meet; the job runs anyway and "
                    "its events say it is best-effort, with the predicted completion")
    name: SafeStr | None = Field(None, min_length=1, max_length=128)
    entrypoint: SafeStr | None = Field(None, min_length=1, max_length=1024,
                                       description="your own training command, e.g. "
                                       "'python train.py' (default: the built-in trainer); "
                                       "it gets the plan as environment variables (README)")
    working_dir: SafeStr | None = Field(
        None, min_length=1, max_length=4096, description=(
            "a folder the service can read, shipped to every worker (Ray runtime_env "
            "working_dir); the entrypoint starts in its own copy of it"))
    max_gpus: int | None = Field(None, ge=1, le=4096, strict=True,
                                 description="cap on one plan's GPUs")
    ranking: SafeStr | None = Field(None, max_length=32,
                                    description="gpu_seconds (default), job_time, fewest_gpus")

    runtime: SafeStr | None = Field(
        None, max_length=32,
        description="runtime profile the memory is priced for: frenzy (built-in, default), "
                    "megatron, deepspeed, fsdp2, hf-trainer, torchtune, colossalai; a job "
                    "with an entrypoint and no runtime gets the most conservative")

    data: DataCreate | None = Field(
        None, description="'synthetic' (the default: learnable generated sequences) or the "
        "job's data")
    init_from: SafeStr | None = Field(
        None, min_length=1, max_length=4096, description=(
            "a Hugging Face model folder (config.json + *.safetensors) to fine-tune; the "
            "model may then be left out"))

    @field_validator("data", mode="before")
    @classmethod
    def _synthetic(cls, value: Any) -> Any:
        """``data: synthetic`` is the default, stored as no data."""
        if isinstance(value, str):
            if value.strip().lower() == "synthetic":
                return None
            raise ValueError(f"'synthetic' or an object {{path: ..., tokenizer: ...}}; got "
                             f"{value!r} (a path goes under data.path)")
        return value

    @field_validator("hf_config")
    @classmethod
    def _bounded_document(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        if value is not None:
            check_json_document(value)
        return value


# -- responses ----------------------------------------------------------------------------


class _Public(BaseModel):
    model_config = ConfigDict(from_attributes=True)


class PlanPublic(_Public):
    """One ranked plan: layout, per-GPU memory (with its breakdown) and predicted time."""

    model_config = ConfigDict(extra="ignore")

    rank: int
    gpu_type: str
    num_gpus: int
    tp: int
    pp: int
    dp: int
    micro_batch: int
    recompute: str
    zero_stage: int
    sequence_parallel: bool = False
    flash_attention: bool = True
    precision: str
    peak_memory_bytes: int
    required_bytes: int
    tensors_bytes: int | None = None  # max_memory_allocated
    reserved_bytes: int | None = None  # max_memory_reserved
    device_bytes: int | None = None  # nvidia-smi (= peak_memory_bytes)
    runtime: str = "frenzy"  # the runtime profile the memory was priced for
    memory_factor: float = Field(
        1.0, description="measured correction in the memory figures (online residual, an "
                         "out-of-memory run; the notes say which); 1: the model's own")
    memory: dict[str, Any]
    step_time_s: float
    step: dict[str, Any]
    num_steps: int
    job_time_s: float
    gpu_seconds: float
    reason: str = ""
    notes: list[str] = Field(default_factory=list)


class ModelPublic(BaseModel):
    name: str
    family: str
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    ffn_hidden_size: int
    vocab_size: int
    max_seq_len: int
    tie_embeddings: bool
    type_vocab_size: int = 0
    head_dim: int | None = None  # one attention head's width (hidden_size / num_heads or given)
    num_params: int | None = None


class TrainingPublic(BaseModel):
    global_batch: int
    seq_len: int
    precision: str
    optimizer: str
    steps: int | None = None
    tokens: int | None = None
    deadline_s: float | None = None
    flash_attention: bool = True
    sequence_parallel: bool = True
    num_steps: int | None = None


class PlansPublic(BaseModel):
    """The answer of ``POST /v1/plans``: nothing is submitted."""

    model: ModelPublic
    training: TrainingPublic
    gpu_types: list[str]
    max_gpus: int
    count: int
    plans: list[PlanPublic]
    notes: list[str] = Field(default_factory=list, description=(
        "About the search: e.g. the plan dimensions the job's runtime does not execute "
        "(a runtime named with a narrower profile), which were not considered"))


class AllocationPublic(_Public):
    node_id: str
    gpu_type: str
    gpus: int
    plan_rank: int | None
    created_at: datetime


class ProgressPublic(BaseModel):
    steps_done: float
    total_steps: int
    fraction: float


class MetricWindowPublic(BaseModel):
    """One step window of a running job: what was measured beside what the plan predicted."""

    at: datetime
    step: float | None = None
    loss: float | None = None
    tokens_per_s: float | None = None
    step_time_s: float | None = Field(None, description="measured: global batch / samples/s")
    predicted_step_time_s: float | None = Field(None, description="the chosen plan's")
    memory_bytes: float | None = Field(
        None, description="measured tensor peak of a rank (max_memory_allocated on CUDA, the "
                          "storage tracker on the CPU)")
    predicted_memory_bytes: float | None = Field(
        None, description="the chosen plan's predicted tensor peak (the same quantity)")


class MemoryPublic(BaseModel):
    """Predicted vs measured per-rank memory of the plan that ran, and the correction of the
    job's predictions after an out-of-memory run."""

    measured_tensors_bytes: int | None = Field(
        None, description="tensor peak of a rank: max_memory_allocated (CUDA) or the CPU "
                          "storage tracker")
    measured_reserved_bytes: int | None = Field(
        None, description="max_memory_reserved (CUDA only)")
    source: str | None = Field(None, description="cuda | cpu-tracker")
    plan: str | None = Field(None, description="the plan measured")
    predicted_tensors_bytes: int | None = None
    predicted_reserved_bytes: int | None = None
    predicted_device_bytes: int | None = None
    error_pct: float | None = Field(
        None, description="(measured - predicted) / predicted tensors, in %; > 0: "
                          "under-predicted")
    memory_factor: float = Field(
        1.0, description="the job's predicted tensors are multiplied by this after "
                         "out-of-memory runs (1: never corrected)")
    out_of_memory_runs: int = 0
    last_out_of_memory: str | None = Field(
        None, description="what the last out-of-memory run held against its capacity")


class MetricsPublic(BaseModel):
    """The job's most recent step windows, oldest first (bounded: the last few hundred)."""

    windows: list[MetricWindowPublic]
    latest: MetricWindowPublic | None


class WaitingPublic(BaseModel):
    """Why a queued job waits: a typed reason and its numbers (``service.queue_reasons``)."""

    kind: str = Field(description="no_plan | larger_than_cluster | waiting_for_gpus | "
                                  "behind_queue | next_round | user_gpu_quota")
    message: str
    gpu_type: str | None = None
    gpus_needed: int | None = None
    gpus_free: int | None = None
    gpus_total: int | None = None
    jobs_ahead: int = Field(0, description="queued jobs ahead of it wanting the same GPU type")
    earliest_start_s: float | None = Field(
        None, description="≈ seconds from now by the plans' predicted times (None: unknown)")


class QueueEntryPublic(BaseModel):
    """One queued job; another user's job shows without its id and name."""

    position: int
    job_id: str | None
    name: str | None
    owner: str | None
    waiting: WaitingPublic


class QueuePublic(BaseModel):
    data: list[QueueEntryPublic]


class JobSummary(BaseModel):
    """A job in a listing (no plans)."""

    id: str
    name: str | None
    owner: str
    state: JobState
    state_reason: str
    model_name: str
    priority: int = Field(0, description="always 0 for new jobs (no policy reads a priority)")
    progress: ProgressPublic
    deadline_at: datetime | None
    created_at: datetime
    updated_at: datetime
    duration_s: float | None = Field(
        None, description="finished jobs: seconds from first getting GPUs to the end (None "
                          "if it never got any)")
    gpu_hours: float | None = Field(
        None, description="GPU-hours held so far (GPUs × hours, over every placement; None "
                          "if it never held a GPU)")


class JobPublic(JobSummary):
    """A job in full: plans, the plan chosen, GPUs held by node, progress, timestamps."""

    model: ModelPublic
    training: TrainingPublic
    deadline_s: float | None
    entrypoint: str | None
    max_runtime_s: float | None = Field(
        None, description="the run-time limit it runs under (None: none)")
    running_s: float = Field(
        0.0, description="seconds spent running so far, as last recorded (kept for jobs "
                         "with a run-time limit)")
    plans: list[PlanPublic] = Field(
        description="the best ranked plans (``?plans=N`` or ``?plans=all`` for more)")
    plans_total: int = Field(0, description="how many ranked plans the job has")
    notes: list[str] = Field(default_factory=list,
                             description="what submission found (e.g. the data's epochs)")
    chosen_plan: PlanPublic | None
    allocation: list[AllocationPublic]
    placed_at: datetime | None
    started_at: datetime | None
    finished_at: datetime | None
    waiting: WaitingPublic | None = Field(
        None, description="while queued: why, with numbers (None once it holds GPUs)")
    metrics: MetricsPublic | None = Field(
        None, description="loss, tokens/s, step time and memory per step window, measured "
                          "and predicted (None before the first report)")
    memory: MemoryPublic | None = Field(
        None, description="predicted vs measured peak memory (None before the workers "
                          "report one)")


class JobsPublic(BaseModel):
    data: list[JobSummary]
    count: int = Field(description="jobs matching the filters, over all pages")
    limit: int
    offset: int


class EventPublic(_Public):
    id: int
    job_id: str
    at: datetime
    kind: str
    state: str | None
    message: str
    data: dict[str, Any] | None


class EventsPublic(BaseModel):
    data: list[EventPublic]
    next_after: int | None = Field(description="pass as ?after= for the next page")


class CancelRequest(_Create):
    reason: SafeStr | None = Field(None, max_length=500)


class HolderPublic(BaseModel):
    job_id: str | None = Field(description="null: another user's job")
    gpus: int


class NodePublic(BaseModel):
    id: str
    gpu_type: str
    gpu_memory_bytes: int
    total_gpus: int
    free_gpus: int
    used_gpus: int
    interconnect: str
    holders: list[HolderPublic]


class GpuTypePublic(BaseModel):
    name: str
    memory_bytes: int
    total_gpus: int
    free_gpus: int
    used_gpus: int
    nodes: int


class PlacementPublic(BaseModel):
    job_id: str
    placement: list[HolderNodePublic]


class HolderNodePublic(BaseModel):
    node_id: str
    gpus: int


class ClusterPublic(BaseModel):
    nodes: list[NodePublic]
    gpu_types: list[GpuTypePublic]
    total_gpus: int
    free_gpus: int
    used_gpus: int
    jobs: list[PlacementPublic]


class UtilisationPublic(BaseModel):
    gpu_type: str
    capacity_gpus: int
    mean: float
    series: list[UtilisationPoint]


class UtilisationPoint(BaseModel):
    start: datetime
    used_fraction: float


class DeadlinePublic(BaseModel):
    jobs: int
    met: int
    hit_rate: float | None


class StatsPublic(BaseModel):
    now: datetime
    window_s: float
    bucket_s: float
    utilisation: list[UtilisationPublic]
    queue_length: int
    avg_jct_s: float | None
    avg_queueing_s: float | None
    deadline: DeadlinePublic
    jobs_by_state: dict[str, int]
    finished_in_window: int


class UserUsagePublic(BaseModel):
    """One user's jobs and GPU use."""

    owner: str
    jobs: int = Field(description="all the user's jobs, any state")
    running: int = Field(description="jobs holding GPUs now (placed, starting, running, "
                                     "resizing)")
    queued: int = Field(description="jobs waiting (pending)")
    gpus_held: int = Field(description="GPUs the user's jobs hold now")
    gpu_hours: float = Field(description="GPU-hours the user's jobs have held (in the window "
                                         "when one is given)")


class UsersPublic(BaseModel):
    """Per-user usage, busiest first (GPU-hours, then owner)."""

    now: datetime
    window_s: float | None = Field(description="GPU-hours counted over this look-back "
                                               "(None: all time)")
    data: list[UserUsagePublic]


class ArtifactPublic(BaseModel):
    """One checkpoint of a job: its step and where the file is."""

    step: int
    path: str
    size_bytes: int
    modified_at: datetime


class ArtifactsPublic(BaseModel):
    """A job's checkpoints (oldest first) and how to export one."""

    job_id: str
    checkpoint_dir: str
    data: list[ArtifactPublic]
    export: str = Field(description="the command that writes a Hugging Face model folder")


class ErrorItem(BaseModel):
    field: str
    message: str


class ErrorPublic(BaseModel):
    """Every 4xx: ``detail`` is one readable line (``field: what is wrong``)."""

    detail: str
    errors: list[ErrorItem]


PlacementPublic.model_rebuild()
UtilisationPublic.model_rebuild()

# -- mapping predictor errors onto request fields ------------------------------------------

_TRAINING_FIELDS = frozenset(TrainingCreate.model_fields) | {"deadline_s"}
_DIMENSION_FIELDS = frozenset(ModelDimensions.model_fields)


def spec_error_field(field: str, source: str) -> str:
    """The request path of a ``SpecError.field``; ``source`` is how the model was given
    (``model``, ``hf_config`` or ``dimensions``)."""
    if field in ("deadline_s",):
        return field
    if field in _TRAINING_FIELDS:
        return f"training.{field}"
    if field.startswith("config.") or field == "config":
        return "hf_config" + field[len("config"):]
    if source == "dimensions" and field in _DIMENSION_FIELDS:
        return f"dimensions.{field}"
    if source == "hf_config" and field in _DIMENSION_FIELDS:
        return "hf_config"
    return field
