"""Turn a submission body into specs and ranked plans, with a cache per identical body.

The planner is injected (``Planner``) so tests can stub it and the service never plans at
import time. Results are cached per (model, training, cluster GPU types, max GPUs,
ranking): planning is pure, and identical submissions are common (retries, sweeps, load
tests), so a repeat costs a dictionary lookup.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from predictor.errors import SpecError
from predictor.runtimes import DEFAULT_RUNTIME
from predictor.spec import ModelSpec, TrainingSpec
from service.api.errors import ApiError
from service.api.inventory import Inventory
from service.limits import MODEL_BOUNDS, model_bound_problem, planner_range_problem
from service.schemas import JobCreate, spec_error_field

if TYPE_CHECKING:
    from predictor.planner import PlanResult

log = logging.getLogger(__name__)


class Planner(Protocol):
    """``predictor.planner.plan_job`` over named GPU types (None: the whole catalog)."""

    def __call__(
        self,
        model: ModelSpec,
        train: TrainingSpec,
        gpu_types: Sequence[str] | None,
        *,
        max_gpus: int,
        ranking: str,
    ) -> PlanResult: ...


def default_planner(
    model: ModelSpec,
    train: TrainingSpec,
    gpu_types: Sequence[str] | None,
    *,
    max_gpus: int,
    ranking: str,
    runtime: str = "frenzy",
    memory_factors: dict[str, tuple[float, str]] | None = None,
) -> PlanResult:
    """The predictor's planner over the catalog entries of ``gpu_types``, pricing memory for
    the runtime profile ``runtime`` with the measured ``memory_factors`` per GPU type."""
    from predictor.gpus import get_gpu
    from predictor.planner import plan_job

    gpus = [get_gpu(t) for t in gpu_types] if gpu_types else None
    return plan_job(model, train, gpus, max_gpus=max_gpus, ranking=ranking, runtime=runtime,
                    memory_factors=memory_factors)


def plan_gpu_cap(requested: int | None, default: int, hard: int = 0) -> int:
    """The most GPUs one plan of a job may use before the cluster's size: the job's own
    ``max_gpus``, else the service's default, under the operator's ``hard`` cap
    (``quota_max_gpus``; 0: none). Submission plans with it; a job planned again after
    running out of memory keeps to it (``service.app_runtime.stored_view``)."""
    cap = requested or default
    return min(cap, hard) if hard else cap


def known_gpu_types(names: Sequence[str]) -> tuple[dict[str, str], list[str]]:
    """Split cluster GPU type names into ({cluster name: catalog name}, unknown names)."""
    from predictor.gpus import get_gpu

    known: dict[str, str] = {}
    unknown: list[str] = []
    for name in names:
        try:
            known[name] = get_gpu(name).name
        except SpecError:
            unknown.append(name)
    return known, unknown


@dataclass(frozen=True, slots=True)
class Planned:
    """Specs and ranked plans of one body; ``plan_dicts`` are the JSON forms of ``plans``."""

    model: ModelSpec
    train: TrainingSpec
    source: str
    plans: tuple[Any, ...]
    plan_dicts: tuple[dict[str, Any], ...]
    gpu_types: tuple[str, ...]
    max_gpus: int
    key: str = ""
    """The planning cache key (model, training, GPU types, max GPUs, ranking)."""
    model_dict: dict[str, Any] = dataclasses.field(default_factory=dict)
    train_dict: dict[str, Any] = dataclasses.field(default_factory=dict)
    stored_json: tuple[str, str, str] = ("", "", "")
    """``model_spec``, ``training`` and the ranked ``plans`` as the JSON text stored on a
    job row: serialised once per plan set, not per submission."""
    notes: tuple[str, ...] = ()
    """About the search (``PlanResult.notes``: what the runtime excluded)."""


def spec_dict(spec: Any) -> dict[str, Any]:
    """A frozen spec dataclass as plain JSON values (enums as their values)."""
    return json.loads(json.dumps(dataclasses.asdict(spec), default=str))


def canonical_hash(value: Any) -> str:
    return hashlib.sha256(
        json.dumps(value, sort_keys=True, separators=(",", ":"), default=str).encode()
    ).hexdigest()


def job_runtime(body: JobCreate) -> str:
    """The runtime profile a job's memory is priced for: the one it names; a job with its
    own entrypoint that names none gets the most conservative profile, a built-in job the
    built-in trainer's. ``ApiError`` 422 naming ``runtime`` when unknown."""
    from predictor.runtimes import CONSERVATIVE_RUNTIME, get_runtime

    if body.runtime is None:
        return CONSERVATIVE_RUNTIME if body.entrypoint else DEFAULT_RUNTIME
    try:
        return get_runtime(body.runtime).name
    except SpecError as exc:
        raise ApiError(422, "runtime", exc.reason) from None


def resolve_specs(body: JobCreate) -> tuple[ModelSpec, TrainingSpec, str]:
    """The model and training specs of a body; ``ApiError`` 422 naming the field if bad."""
    given = [k for k in ("model", "hf_config", "dimensions") if getattr(body, k) is not None]
    if not given and body.init_from:  # the model is the folder's config.json
        from service.api.job_inputs import init_from_spec

        given = ["init_from"]
    if len(given) != 1:
        what = "none" if not given else ", ".join(given)
        raise ApiError(
            422, "model",
            f"give exactly one of model (a catalog name), hf_config (a config.json object) "
            f"or dimensions (or init_from a model folder); got {what}",
        )
    source = given[0]
    try:
        if source == "init_from":
            model = init_from_spec(body)[0]
        elif source == "model":
            model = ModelSpec.from_name(body.model or "")
        elif source == "hf_config":
            model = ModelSpec.from_hf_config(body.hf_config or {}, name=body.name)
            _check_builtin_type(body)
        else:
            assert body.dimensions is not None
            model = ModelSpec.from_dict(body.dimensions.model_dump())
        t = body.training
        train = TrainingSpec(
            global_batch=t.global_batch, seq_len=t.seq_len, precision=t.precision,
            optimizer=t.optimizer, steps=t.steps, tokens=t.tokens, deadline_s=body.deadline_s,
            flash_attention=t.flash_attention, sequence_parallel=t.sequence_parallel,
        )
        train.check_against(model)
        _check_limits(model, train, source)
    except SpecError as exc:
        raise ApiError(422, spec_error_field(exc.field, source), exc.reason) from None
    except (TypeError, ValueError) as exc:  # a config.json value of the wrong type
        raise ApiError(422, source, str(exc)) from None
    return model, train, source


def _check_builtin_type(body: JobCreate) -> None:
    """``SpecError`` naming ``config.model_type`` when the built-in trainer would run the job
    (no entrypoint) and it does not build that architecture (``TRAINER_MODEL_TYPES``)."""
    from predictor.spec import TRAINER_MODEL_TYPES

    model_type = (body.hf_config or {}).get("model_type")
    if body.entrypoint or model_type in TRAINER_MODEL_TYPES:
        return
    raise SpecError(
        "config.model_type",
        f"{model_type!r} is priced with the layers it shares with a known family, but the "
        f"built-in trainer builds {', '.join(TRAINER_MODEL_TYPES)} only: give an entrypoint "
        "(and its runtime) to train it with your own code, or price it with POST /v1/memory",
    )


def _check_limits(model: ModelSpec, train: TrainingSpec, source: str) -> None:
    """``ApiError`` 422 when the model is out of ``service.limits.MODEL_BOUNDS`` (an
    ``hf_config``'s numbers reach no schema field) or the job out of the planner's
    integer range (``service.limits.planner_range_problem``)."""
    from predictor.memory import estimate_memory
    from predictor.spec import ParallelConfig, Recompute

    bad = model_bound_problem({k: getattr(model, k, None) for k in MODEL_BOUNDS})
    if bad is not None:
        name, why = bad
        field = spec_error_field(name, source)
        raise ApiError(422, field, why if field.endswith(name) else f"{name}: {why}")
    whole = ParallelConfig(micro_batch=train.global_batch, recompute=Recompute.NONE,
                           flash_attention=train.flash_attention)
    problem = planner_range_problem(estimate_memory(model, train, whole).tensors)
    if problem is not None:
        raise ApiError(422, "training.global_batch", problem)


class Residual(Protocol):
    """Measured corrections of predicted memory per GPU type (``ResidualCache``)."""

    def factors(self, runtime: str, family: str,
                gpu_types: Sequence[str]) -> dict[str, tuple[float, str]]: ...

    version: int
    """Changes with the corrections."""

    def due(self) -> bool:
        """Whether ``refresh`` would reread (no I/O)."""
        ...

    def refresh(self) -> int:
        """Reread if due; the version."""
        ...


class PlanningService:
    """Plans bodies against the cluster's GPU types, through an LRU cache."""

    def __init__(
        self,
        planner: Planner | Callable[..., PlanResult],
        *,
        cache_size: int,
        default_max_gpus: int,
        default_ranking: str,
        max_plans: int,
        hard_max_gpus: int = 0,
        residual: Residual | None = None,
    ) -> None:
        """``hard_max_gpus`` (0: none) caps every plan's GPUs whatever the body asks for
        (the ``quota_max_gpus`` setting); ``residual`` gives the measured corrections of
        the predicted memory (``service.memory_residual``; None: none)."""
        self._planner = planner
        self._residual = residual
        self._hard_max_gpus = hard_max_gpus
        self._cache_size = cache_size
        self._default_max_gpus = default_max_gpus
        self._default_ranking = default_ranking
        self._max_plans = max_plans
        self._cache: OrderedDict[str, Planned] = OrderedDict()
        self._by_request: OrderedDict[tuple[Any, ...], Planned] = OrderedDict()
        self._lock = threading.Lock()
        self._inflight: dict[str, threading.Lock] = {}
        self.hits = 0
        self.misses = 0

    def _request_key(self, inventory: Inventory, request_hash: str,
                     version: int) -> tuple[Any, ...]:
        """The whole-body cache's key: the body, the inventory and the corrections' version."""
        return (request_hash, tuple(sorted(inventory.total_by_type.items())), version)

    def _lookup_request(self, key: tuple[Any, ...]) -> Planned | None:
        with self._lock:
            hit = self._by_request.get(key)
            if hit is not None:
                self._by_request.move_to_end(key)
                self.hits += 1
            return hit

    def cached_request(self, inventory: Inventory, request_hash: str) -> Planned | None:
        """What ``plan_request`` would return if it is cached (else None: plan it). Does no
        I/O (the API calls it on its event loop): when the measured corrections are due a
        reread, it answers None and ``plan_request`` rereads them on a worker thread."""
        residual = self._residual
        if residual is not None and residual.due():
            return None
        return self._lookup_request(self._request_key(
            inventory, request_hash, residual.version if residual is not None else 0))

    def plan_request(self, body: JobCreate, inventory: Inventory, request_hash: str) -> Planned:
        """``plan`` through a second cache keyed by the canonical hash of the whole body and
        the inventory: an identical submission skips resolving and hashing its specs."""
        version = self._residual.refresh() if self._residual is not None else 0
        key = self._request_key(inventory, request_hash, version)
        hit = self._lookup_request(key)
        if hit is not None:
            return hit
        planned = self.plan(body, inventory)
        if self._cache_size:
            with self._lock:
                self._by_request[key] = planned
                while len(self._by_request) > self._cache_size:
                    self._by_request.popitem(last=False)
        return planned

    def plan(self, body: JobCreate, inventory: Inventory) -> Planned:
        """Ranked plans for ``body``; ``ApiError`` 422 when the input is bad or nothing
        fits any GPU of the cluster (the message says the per-GPU need)."""
        model, train, source = resolve_specs(body)
        known, unknown = known_gpu_types(inventory.gpu_types)
        if unknown:
            log.warning("GPU types unknown to the predictor skipped: %s", ", ".join(unknown))
        if inventory.total_by_type and not known:
            raise ApiError(
                503, "cluster",
                f"no GPU type of this cluster is in the predictor's catalog "
                f"({', '.join(unknown)}); add it to predictor/data/gpus.yaml",
            )
        cap = plan_gpu_cap(body.max_gpus, self._default_max_gpus, self._hard_max_gpus)
        if known:
            cap = min(cap, max(inventory.total_by_type[t] for t in known))
        ranking = body.ranking or self._default_ranking
        runtime = job_runtime(body)
        factors = (self._residual.factors(runtime, model.family.value, sorted(known.values()))
                   if self._residual is not None else {})
        key = canonical_hash(
            {"m": spec_dict(model), "t": spec_dict(train), "g": sorted(known.values()), "n": cap,
             "r": ranking, **({"rt": runtime} if runtime != DEFAULT_RUNTIME else {}),
             **({"mf": sorted((g, f) for g, (f, _) in factors.items())} if factors else {})}
        )
        with self._lock:
            hit = self._cache.get(key)
            if hit is not None:
                self._cache.move_to_end(key)
                self.hits += 1
        if hit is not None:
            if hit.source != source:
                hit = dataclasses.replace(hit, source=source)
            return hit
        # One computation per key at a time: concurrent first submissions of a body (a
        # burst of identical jobs) wait for it instead of each running the planner.
        with self._lock:
            flight = self._inflight.setdefault(key, threading.Lock())
        with flight:
            with self._lock:
                hit = self._cache.get(key)
            if hit is not None:
                return hit if hit.source == source else dataclasses.replace(hit, source=source)
            try:
                planned = self._compute(model, train, source, sorted(known.values()), cap,
                                        ranking, key, runtime, factors)
                with self._lock:
                    self.misses += 1
                    if self._cache_size:
                        self._cache[key] = planned
                        while len(self._cache) > self._cache_size:
                            self._cache.popitem(last=False)
            finally:
                with self._lock:
                    self._inflight.pop(key, None)
        return planned

    def _compute(
        self,
        model: ModelSpec,
        train: TrainingSpec,
        source: str,
        gpu_types: list[str],
        max_gpus: int,
        ranking: str,
        key: str = "",
        runtime: str = DEFAULT_RUNTIME,
        factors: dict[str, tuple[float, str]] | None = None,
    ) -> Planned:
        # the runtime (and corrections) go to the planner only when there are any, so
        # planners written before them keep working for built-in jobs
        extra: dict[str, Any] = {"runtime": runtime} if runtime != DEFAULT_RUNTIME else {}
        if factors:
            extra["memory_factors"] = factors
        try:
            result = self._planner(
                model, train, gpu_types or None, max_gpus=max_gpus, ranking=ranking, **extra
            )
        except SpecError as exc:
            raise ApiError(422, spec_error_field(exc.field, source), exc.reason) from None
        if not result.plans:
            where = (
                f" (this cluster's GPU types: {', '.join(gpu_types)}; at most {max_gpus} "
                "GPUs of one type)" if gpu_types else ""
            )
            raise ApiError(422, "model", f"{result.infeasible or 'no plan fits'}{where}")
        plans = tuple(result.plans[: self._max_plans])
        dicts = tuple(json.loads(json.dumps(p.to_dict(), default=str)) for p in plans)
        ranked = [d if d.get("rank") == i else {**d, "rank": i} for i, d in enumerate(dicts, 1)]
        model_dict, train_dict = spec_dict(model), spec_dict(train)
        return Planned(
            model=model, train=train, source=source, plans=plans, plan_dicts=dicts,
            gpu_types=tuple(gpu_types), max_gpus=max_gpus, key=key, model_dict=model_dict,
            train_dict=train_dict,
            stored_json=(json.dumps(model_dict), json.dumps(train_dict), json.dumps(ranked)),
            notes=tuple(getattr(result, "notes", ())),
        )
