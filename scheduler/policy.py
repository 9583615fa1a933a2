"""The one policy interface, the injected performance model, and the policy registry.

Policies are pure and deterministic: everything they need arrives as arguments (state,
queue, running jobs, ``now``); randomness only through a seed given at construction.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from predictor.plan import Plan
from scheduler.cluster import ClusterState, Placement
from scheduler.decision import Decision
from scheduler.job import JobView, RunningJob


@dataclass(frozen=True, slots=True)
class PolicyNote:
    """What a policy asks to keep about one job across a restart of the service.

    ``data`` is the policy's own small record, JSON-serialisable (str keys; str, int, float,
    bool, None, lists and dicts): the service stores it with the job (``jobs.policy_state``)
    and hands it back to ``restore`` after a crash. The policy stays pure: it only hands
    notes out and reads them back, the caller does the I/O."""

    job_id: str
    data: Mapping[str, Any]


@runtime_checkable
class Policy(Protocol):
    """Decide what to start, stop or resize now. Must not mutate its arguments.

    A policy whose promises outlive a restart (the deadline policies' admitted jobs) also
    has two optional methods, called through ``take_notes`` and ``restore`` below:
    ``take_notes() -> list[PolicyNote]``, the notes changed since the last call (the latest
    note of a job replaces its earlier ones), and ``restore(jobs, notes)``, called once
    before the first ``decide`` of a restarted service with the live jobs and the stored
    notes, which rebuilds the policy's state from them alone (deterministically: the same
    notes give the same state). A policy without them keeps nothing across a restart."""

    name: str

    def decide(
        self,
        state: ClusterState,
        pending: Sequence[JobView],
        running: Sequence[RunningJob],
        now: float,
    ) -> list[Decision]: ...


def wake_at(policy: Policy) -> float | None:
    """The time ``policy`` asked, in its last ``decide``, to be called again even if nothing
    happens before (an optional ``wake_at`` attribute; None: only on events and ticks).
    A policy that holds a move back until some time needs it where the controller is driven
    by events alone (the simulator); in production the controller's periodic tick covers it."""
    return getattr(policy, "wake_at", None)


def holds_until(policy: Policy) -> float | None:
    """The latest start still to come that ``policy`` booked in its last ``decide`` (a
    deadline policy's reservation held late; the job may run before it on leftovers); None:
    it booked none (an optional ``holds_until`` attribute). A driver that ends once no waiting
    job can ever start (the simulator, on an idle cluster with nothing more to come) reads it:
    a job waiting for its booked start is not stuck."""
    return getattr(policy, "holds_until", None)


def take_notes(policy: Policy) -> list[PolicyNote]:
    """The notes ``policy`` changed since the last call ([] for a policy without any)."""
    fn = getattr(policy, "take_notes", None)
    return list(fn()) if fn is not None else []


def restore(policy: Policy, jobs: Sequence[JobView], notes: Sequence[PolicyNote]) -> None:
    """Rebuild ``policy``'s state after a restart from the live ``jobs`` and the stored
    ``notes`` (notes of ended jobs may be among them: history some policies use); nothing
    for a policy without a ``restore`` method."""
    fn = getattr(policy, "restore", None)
    if fn is not None:
        fn(jobs, notes)


class PerfModel(Protocol):
    """Step time of a plan on a concrete placement (Pollux's ``speedup_fn`` idea): injected
    so tests can pass stubs and the simulator and production share one model."""

    def placed_plan(self, job: JobView, plan: Plan, placement: Placement,
                    state: ClusterState) -> Plan: ...


PolicyFactory = Callable[..., Policy]
_REGISTRY: dict[str, PolicyFactory] = {}


def register(name: str) -> Callable[[PolicyFactory], PolicyFactory]:
    """Class decorator: make a policy constructible by name."""

    def deco(factory: PolicyFactory) -> PolicyFactory:
        if name in _REGISTRY:
            raise ValueError(f"policy {name!r} registered twice")
        _REGISTRY[name] = factory
        return factory

    return deco


def make_policy(name: str, **kwargs: Any) -> Policy:
    """Build a registered policy; unknown names list the known ones."""
    import scheduler.policies  # noqa: F401  (registers the built-in policies)

    if name not in _REGISTRY:
        raise KeyError(f"unknown policy {name!r}; known: {', '.join(sorted(_REGISTRY))}")
    return _REGISTRY[name](**kwargs)


def policy_accepts(name: str, param: str) -> bool:
    """Whether the registered policy ``name`` takes a keyword argument ``param`` (optional
    inputs such as a step-time estimator go only to the policies that use them)."""
    import inspect

    import scheduler.policies  # noqa: F401

    factory = _REGISTRY.get(name)
    if factory is None:
        return False
    try:
        return param in inspect.signature(factory).parameters
    except (TypeError, ValueError):
        return False


def policy_names() -> list[str]:
    import scheduler.policies  # noqa: F401

    return sorted(_REGISTRY)
