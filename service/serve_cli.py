"""``frenzy serve`` (the whole service in one command), ``frenzy migrate`` (only its first step,
for a deployment's one-off migration job) and its HTTP clients ``frenzy submit``,
``frenzy jobs``, ``frenzy resubmit``, ``frenzy cancel`` and ``frenzy status``.

``serve`` brings the database to the latest migration, records the cluster's nodes, recovers
every live job (``service.app_runtime``), makes sure the local admin has a token (written to
``~/.config/frenzy/token``, mode 600, so the client commands work without set-up), and serves
the API, the dashboard and ``/metrics`` with uvicorn. With ``--workers N`` the API runs in N
uvicorn worker processes (on Linux each with its own ``SO_REUSEPORT`` socket:
``service.serve_workers``) while the one Controller runs in the supervising process; they
meet in the database.

The client commands talk to ``$FRENZY_URL`` (default http://127.0.0.1:8000) with the token
from ``$FRENZY_TOKEN``, else the token file.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

DEFAULT_URL = "http://127.0.0.1:8000"
SINGLE_ACCEPT = "UV_TCP_SINGLE_ACCEPT"
"""libuv's switch to accept one connection per wake-up of a listening socket (then yield to
the other processes sharing it), read by each worker process at its first ``listen``; used
where the workers share one socket (no ``SO_REUSEPORT`` balancing: not Linux)."""
WORKER_SWITCH_INTERVAL_S = 0.001
"""The API worker processes' GIL switch interval (Python's default: 5 ms). Their submission
writer thread holds the SQLite writer lock while it runs its few statements, and wins the
GIL back after each one; with the event loop busy, each of those hand-overs waited up to the
whole interval, so the lock (which the other worker and the Controller wait for) was held
tens of milliseconds for a ~1 ms transaction. In six alternating api_load pairs a 1 ms
interval lowered POST p99 in all six (docs/api_load.md)."""
DEFAULT_CLUSTER = "frenzy-testbed"
LOCAL_ADMIN = "admin"


def token_file() -> Path:
    """Where ``serve`` keeps the local admin's token (``$FRENZY_TOKEN_FILE`` overrides)."""
    env = os.environ.get("FRENZY_TOKEN_FILE")
    if env:
        return Path(env)
    base = Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config")
    return base / "frenzy" / "token"


def add_serve_parsers(subparsers: argparse._SubParsersAction) -> None:
    """Add ``serve``, ``migrate``, ``submit``, ``jobs``, ``cancel``, ``logs`` and ``status`` to
    ``frenzy``."""
    p = subparsers.add_parser("serve", help="run the service: API, dashboard, scheduler",
                              description=__doc__.splitlines()[0])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--cluster", default=DEFAULT_CLUSTER,
                   help="cluster emulated or checked against Ray: a YAML file or a packaged "
                        "name (default: %(default)s; see orchestrator/data/clusters)")
    p.add_argument("--policy", default="has", help="scheduling policy (has, opportunistic, sia)")
    p.add_argument("--database-url", default=None, help="default: $DATABASE_URL or SQLite")
    p.add_argument("--backend", default="auto", choices=("auto", "ray", "sim"),
                   help="ray: train for real on the (emulated) Ray cluster; sim: jobs progress "
                        "at their predicted speed, nothing trains; auto: ray when available")
    p.add_argument("--workers", type=int, default=1, help="uvicorn API worker processes")
    p.add_argument("--token-file", default=None, help="where to write the local admin token")
    p.add_argument("--log-level", default="info")
    p.set_defaults(handler=run_serve)

    m = subparsers.add_parser("migrate", help="bring the database to the latest migration",
                              description="Run the installed package's Alembic migrations up "
                                          "to head (what serve does first).")
    m.add_argument("--database-url", default=None, help="default: $DATABASE_URL or SQLite")
    m.set_defaults(handler=run_migrate)

    s = subparsers.add_parser("submit", help="submit a job file (YAML or JSON) to the service")
    s.add_argument("file", help="job description, e.g. examples/gpt2-tiny.yaml")
    s.add_argument("--json", action="store_true", help="print the service's answer as JSON")
    s.add_argument("-f", "--follow", action="store_true",
                   help="then print its state changes, loss and throughput until it ends")
    s.add_argument("--plan-only", action="store_true",
                   help="only rank the plans on the service's cluster (nothing is submitted)")
    s.set_defaults(handler=run_submit)

    j = subparsers.add_parser("jobs", help="list jobs (or show one: frenzy jobs ID)")
    j.add_argument("job_id", nargs="?", default=None,
                   help="show this job (id or a unique prefix; --json: raw)")
    j.add_argument("--id", default=None, help="same as the positional ID")
    j.add_argument("--state", action="append", default=None, help="filter (repeatable)")
    j.add_argument("--limit", type=int, default=50)
    j.add_argument("--json", action="store_true")
    j.set_defaults(handler=run_jobs)

    rs = subparsers.add_parser("resubmit", help="run a finished job of yours again (a new "
                                                 "job with the same request)")
    rs.add_argument("job_id")
    rs.set_defaults(handler=run_resubmit)

    c = subparsers.add_parser("cancel", help="cancel a job")
    c.add_argument("job_id", help="id or a unique prefix")
    c.add_argument("--reason", default=None)
    c.set_defaults(handler=run_cancel)

    lg = subparsers.add_parser("logs", help="a job's output (one rank; -f: follow it)")
    lg.add_argument("job_id", help="id or a unique prefix")
    lg.add_argument("-f", "--follow", action="store_true",
                    help="keep printing new output until the job ends")
    lg.add_argument("--rank", type=int, default=0, help="which rank (default 0)")
    lg.set_defaults(handler=run_logs)

    st = subparsers.add_parser("status", help="cluster occupancy and queue of the service")
    st.add_argument("--json", action="store_true")
    st.set_defaults(handler=run_status)


# -- serve -----------------------------------------------------------------------------------
def _driver_factory(kind: str) -> Callable[..., Any]:
    """The backend driver for ``--backend`` (``auto``: Ray when its driver is installed)."""
    from service import app_runtime

    if kind == "sim":
        return app_runtime.sim_driver_factory
    try:
        from service.ray_driver import ray_driver_factory
    except ImportError as exc:
        if kind == "ray":
            raise SystemExit(
                f"error: --backend ray: the Ray backend is not available ({exc})") from None
        log.warning("Ray backend not available (%s): jobs are simulated, nothing trains", exc)
        return app_runtime.sim_driver_factory
    return ray_driver_factory


def ensure_admin_token(url: str, path: Path) -> str:
    """The local admin's token: the one in ``path`` if this database knows it, else a new
    one written there (mode 600)."""
    from service.auth import create_token, verify_token, write_private_file
    from service.db.engine import make_engine, make_session_factory, write_session

    engine = make_engine(url)
    try:
        factory = make_session_factory(engine)
        if path.exists():
            token = path.read_text().strip()
            with factory() as session:
                p = verify_token(session=session, token=token)
            if p is not None and p.is_admin:
                return token
        with write_session(factory) as session:
            token = create_token(session=session, owner=LOCAL_ADMIN, is_admin=True,
                                 label="frenzy serve local admin")
    finally:
        engine.dispose()
    write_private_file(path, token + "\n")  # 0600 from creation, renamed into place
    log.info("local admin token written to %s", path)
    return token


def worker_app() -> Any:
    """App factory for uvicorn worker processes (``--workers N``): settings from the
    environment ``serve`` exported; jobs reach the Controller through the database."""
    from service.api import create_app
    from service.app_runtime import WakeRunner
    from service.settings import Settings

    app = create_app(settings=Settings.from_env(), runner=WakeRunner())
    freeze_startup_heap()
    sys.setswitchinterval(WORKER_SWITCH_INTERVAL_S)
    return app


def freeze_startup_heap() -> None:
    """The modules and the app are built: keep them out of the collector's generations so
    a full collection under load does not walk them (a latency spike per collection; in the
    supervising process it can stall the Controller while it holds the SQLite writer lock:
    docs/api_load.md)."""
    import gc

    gc.collect()
    gc.freeze()


def run_migrate(args: argparse.Namespace) -> int:
    """``frenzy migrate``: the database at ``--database-url`` (or the settings') to head."""
    from service.db.engine import migrate
    from service.settings import Settings

    overrides = {"database_url": args.database_url} if args.database_url else {}
    migrate(Settings.from_env(**overrides).database_url)
    return 0


def _note_legacy_state(database_url: str) -> None:
    """Say so when ``./var/frenzy.db`` (where earlier versions kept the state) is here but
    the service uses the per-user state directory: nothing is moved behind the user's back."""
    from service.settings import LEGACY_DATABASE, default_database_url

    if database_url == default_database_url() and LEGACY_DATABASE.is_file():
        log.warning("%s is the database of an earlier version (jobs kept in the working "
                    "directory); this service uses %s. To keep using the old one: "
                    "DATABASE_URL=sqlite:///%s (or move it there)", LEGACY_DATABASE,
                    database_url.removeprefix("sqlite:///"), LEGACY_DATABASE.absolute())


def run_serve(args: argparse.Namespace) -> int:
    """Migrate, start the runtime (recovering live jobs), then serve until interrupted."""
    import uvicorn

    from orchestrator.clusters import load_cluster
    from service.api import create_app
    from service.app_runtime import Runtime
    from service.db.engine import WalCheckpointer, make_engine, make_session_factory, migrate
    from service.serve_workers import ReusePortWorkers, reuse_port_available
    from service.settings import Settings

    overrides: dict[str, Any] = {}
    if args.database_url:
        overrides["database_url"] = args.database_url
    settings = Settings.from_env(**overrides)
    _note_legacy_state(settings.database_url)
    os.environ["DATABASE_URL"] = settings.database_url  # for worker processes
    os.environ.setdefault("FRENZY_CHECKPOINT_DIR", settings.checkpoint_dir)
    migrate(settings.database_url)
    cluster = load_cluster(args.cluster)
    token_path = Path(args.token_file) if args.token_file else token_file()
    ensure_admin_token(settings.database_url, token_path)

    engine = make_engine(settings.database_url, busy_timeout_ms=settings.sqlite_busy_timeout_ms,
                         auto_checkpoint=not settings.sqlite_checkpoint_s)
    checkpointer = (WalCheckpointer(engine, settings.sqlite_checkpoint_s).start()
                    if settings.sqlite_checkpoint_s else None)
    runtime = Runtime(settings, make_session_factory(engine), cluster,
                      policy=args.policy, driver_factory=_driver_factory(args.backend))
    runtime.start()
    freeze_startup_heap()
    log.info("serving on http://%s:%d/ (dashboard), API under /v1, docs at /docs",
             args.host, args.port)
    common_config: dict[str, Any] = dict(log_level=args.log_level, access_log=False,
                                         timeout_keep_alive=30)
    common: dict[str, Any] = dict(host=args.host, port=args.port, **common_config)
    status = 0
    try:
        if args.workers > 1 and reuse_port_available():
            # One SO_REUSEPORT socket per worker: the kernel spreads the connections
            # (service.serve_workers; tests/service/test_serve_workers.py).
            status = ReusePortWorkers("service.serve_cli:worker_app", args.workers, args.host,
                                      args.port, config={**common_config, "factory": True}).run()
        elif args.workers > 1:
            # Elsewhere the workers share one listening socket, and libuv (uvloop) accepts
            # every pending connection on a wake-up: a burst of keep-alive clients can all
            # land on one worker. One accept per wake-up gives the other worker its turn (it
            # does not guarantee an even split: docs/api_load.md).
            os.environ.setdefault(SINGLE_ACCEPT, "1")
            uvicorn.run("service.serve_cli:worker_app", factory=True, workers=args.workers,
                        **common)
        else:
            app = create_app(settings=settings, runner=runtime.runner)
            uvicorn.Server(uvicorn.Config(app, **common)).run()
    finally:
        runtime.stop()
        if checkpointer is not None:
            checkpointer.stop()
        engine.dispose()
    return status


# -- HTTP clients ----------------------------------------------------------------------------
class ClientError(RuntimeError):
    """The service answered with an error, or could not be reached."""


def _client() -> Any:
    import httpx

    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per request is noise
    url = os.environ.get("FRENZY_URL", DEFAULT_URL).rstrip("/")
    token = os.environ.get("FRENZY_TOKEN")
    if not token:
        path = token_file()
        if path.exists():
            token = path.read_text().strip()
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return httpx.Client(base_url=url, headers=headers, timeout=30.0)


def _call(method: str, path: str, **kwargs: Any) -> Any:
    import httpx

    try:
        with _client() as client:
            r = client.request(method, path, **kwargs)
    except httpx.HTTPError as exc:
        url = os.environ.get("FRENZY_URL", DEFAULT_URL)
        raise ClientError(f"cannot reach the service at {url} ({exc}); is `frenzy serve` "
                          "running? (set FRENZY_URL for another address)") from None
    if r.status_code >= 400:
        try:
            detail = r.json().get("detail", r.text)
        except ValueError:
            detail = r.text
        raise ClientError(f"{r.status_code}: {detail}")
    return r.json()


FULL_ID = re.compile(r"^[0-9a-f]{32}$")
PREFIX_PAGE = 500
"""Jobs read per request when resolving a prefix (the service's ``max_page_size``)."""
SHOWN_CANDIDATES = 10


def resolve_job_id(given: str) -> str:
    """The job id that ``given`` abbreviates: a full id as is; else the only id of the
    caller's jobs (all jobs for an admin) that starts with it. Ambiguous: ``ClientError``
    listing the candidates. None matches: ``given`` unchanged (the service answers 404)."""
    given = given.strip()
    if FULL_ID.match(given) or not given:
        return given
    matches: list[dict[str, Any]] = []
    offset = 0
    while True:
        page = _call("GET", "/v1/jobs", params={"limit": PREFIX_PAGE, "offset": offset})
        rows = page["data"]
        matches += [j for j in rows if j["id"].startswith(given)]
        offset += len(rows)
        if not rows or offset >= page["count"]:
            break
    exact = [j for j in matches if j["id"] == given]
    if exact or len(matches) == 1:
        return str((exact or matches)[0]["id"])
    if not matches:
        return given
    shown = "\n".join(f"  {j['id']}  {j.get('name') or '-':16s} {j['state']}"
                      for j in matches[:SHOWN_CANDIDATES])
    more = (f"\n  ... and {len(matches) - SHOWN_CANDIDATES} more"
            if len(matches) > SHOWN_CANDIDATES else "")
    raise ClientError(f"job id prefix {given!r} is ambiguous: {len(matches)} jobs match; "
                      f"give more characters:\n{shown}{more}")


def stream_logs(job_id: str, rank: int, follow: bool, out: Any) -> None:
    """Copy ``GET /v1/jobs/{id}/logs`` to ``out`` (a binary stream) as it arrives; when
    following, reconnect from the bytes received whenever the server ends a stream (its
    ``logs_follow_max_s``) before the job has ended."""
    import httpx

    offset = 0
    while True:
        params = {"rank": rank, "follow": "true" if follow else "false", "offset": offset}
        try:
            with _client() as client, client.stream("GET", f"/v1/jobs/{job_id}/logs",
                                                     params=params, timeout=None) as r:
                if r.status_code >= 400:
                    r.read()
                    try:
                        detail = r.json().get("detail", r.text)
                    except ValueError:
                        detail = r.text
                    raise ClientError(f"{r.status_code}: {detail}")
                for chunk in r.iter_bytes():
                    out.write(chunk)
                    out.flush()
                    offset += len(chunk)
        except httpx.HTTPError as exc:
            raise ClientError(f"the log stream broke off ({exc})") from None
        if not follow or _call("GET", f"/v1/jobs/{job_id}",
                               params={"plans": "0"})["state"].lower() in TERMINAL:
            return


def load_job_file(path: str | Path) -> dict[str, Any]:
    """A job description (YAML or JSON) as the request body of ``POST /v1/jobs``."""
    import yaml

    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ClientError(f"no such file: {p}") from None
    try:
        data = json.loads(text) if p.suffix == ".json" else yaml.safe_load(text)
    except (ValueError, yaml.YAMLError) as exc:
        raise ClientError(f"{p}: cannot parse: {exc}") from None
    if not isinstance(data, dict):
        raise ClientError(f"{p}: expected a mapping (model, training, ...)")
    from service.job_paths import resolve_relative_paths

    return resolve_relative_paths(data, p.resolve().parent)  # paths relative to the file


def _guard(fn: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    def wrapped(args: argparse.Namespace) -> int:
        try:
            return fn(args)
        except ClientError as exc:
            sys.stderr.write(f"error: {exc}\n")
            return 1

    wrapped.__name__ = fn.__name__
    wrapped.__doc__ = fn.__doc__
    return wrapped


def _gib(n: float) -> str:
    return f"{n / 2**30:.1f} GiB"


@_guard
def run_submit(args: argparse.Namespace) -> int:
    """``frenzy submit FILE``: post the job, print its id and best plan."""
    body = load_job_file(args.file)
    if args.plan_only:
        plans = _call("POST", "/v1/plans", json=body)
        if args.json:
            print(json.dumps(plans))
            return 0
        types = ", ".join(plans["gpu_types"])
        print(f"{plans['model']['name']}: {plans['count']} plans on {types}")
        for p in plans["plans"][:10]:
            print(f"  {p['rank']:>3}. {p['num_gpus']}x{p['gpu_type']} tp{p['tp']} pp{p['pp']} "
                  f"dp{p['dp']} mb{p['micro_batch']} peak {_gib(p['peak_memory_bytes'])}/GPU "
                  f"{p['step_time_s']:.3f} s/step")
        return 0
    job = _call("POST", "/v1/jobs", json=body)
    if args.json:
        print(json.dumps(job))
        return 0
    print(f"{job['id']}  {job['model_name']}  {job['state']}: {job['state_reason']}")
    if job.get("plans"):
        p = job["plans"][0]
        print(f"  best plan: {p['num_gpus']}x{p['gpu_type']} tp{p['tp']} pp{p['pp']} "
              f"dp{p['dp']} mb{p['micro_batch']}, peak {_gib(p['peak_memory_bytes'])}/GPU, "
              f"{p['step_time_s']:.3f} s/step ({job.get('plans_total', len(job['plans']))} "
              "plans)")
    for note in job.get("notes") or []:
        print(f"  {note}")
    return follow_job(job["id"]) if args.follow else 0


FOLLOW_POLL_S = 2.0
TERMINAL = ("succeeded", "failed", "cancelled")
"""The API's terminal states (``JobState`` values; compared without regard to case)."""


def follow_job(job_id: str, poll_s: float = FOLLOW_POLL_S,
               sleep: Callable[[float], None] | None = None) -> int:
    """Print ``job_id``'s state changes and new step windows until it ends; 0 when it
    succeeded, 1 otherwise (so ``frenzy submit -f`` can gate a script)."""
    import time

    sleep = sleep or time.sleep
    state, last_at = None, None
    while True:
        job = _call("GET", f"/v1/jobs/{job_id}", params={"plans": "0"})
        if (job["state"], job["state_reason"]) != state:
            state = (job["state"], job["state_reason"])
            print(f"[{job['state']}] {job['state_reason']}", flush=True)
        for w in (job.get("metrics") or {}).get("windows", []):
            if last_at is None or w["at"] > last_at:
                last_at = w["at"]
                print(f"  step {_num(w['step'], '.0f')}/{job['progress']['total_steps']}  "
                      f"loss {_num(w['loss'], '.4f')}  {_num(w['tokens_per_s'], ',.0f')} "
                      f"tokens/s  {_num(w['step_time_s'], '.3f', ' s')}/step", flush=True)
        if job["state"].lower() in TERMINAL:
            return 0 if job["state"].lower() == "succeeded" else 1
        sleep(poll_s)


def _num(x: float | None, fmt: str, unit: str = "") -> str:
    return "-" if x is None else f"{x:{fmt}}{unit}"


SPARK = " ▁▂▃▄▅▆▇█"


def sparkline(values: Sequence[float]) -> str:
    """``values`` as block characters, lowest to highest (a loss curve in one line)."""
    if not values:
        return ""
    lo, hi = min(values), max(values)
    span = hi - lo
    return "".join(SPARK[1 + round((v - lo) / span * 7)] if span > 0 else SPARK[4]
                   for v in values)


def format_job(job: dict[str, Any]) -> list[str]:
    """One job, human-readable: state, progress, the plan run, the latest metrics and the
    loss curve of the kept windows."""
    prog = job["progress"]
    lines = [f"{job['id']}  {job.get('name') or job['model_name']}  owner {job['owner']}",
             f"  state     {job['state']}: {job['state_reason']}",
             f"  progress  {prog['steps_done']:.0f}/{prog['total_steps']} steps "
             f"({100 * prog['fraction']:.1f}%)"]
    if job.get("duration_s") is not None or job.get("gpu_hours") is not None:
        lines.append(f"  used      {_duration(job.get('duration_s'))} on GPUs, "
                     f"{_num(job.get('gpu_hours'), '.2f')} GPU-h")
    if job.get("waiting"):
        lines.append(f"  waiting   [{job['waiting']['kind']}] {job['waiting']['message']}")
    p = job.get("chosen_plan") or (job.get("plans") or [None])[0]
    if p:
        which = "plan" if job.get("chosen_plan") else "best plan"
        lines.append(f"  {which:9s} {p['num_gpus']}x{p['gpu_type']} tp{p['tp']} pp{p['pp']} "
                     f"dp{p['dp']}, {p['step_time_s']:.3f} s/step predicted, peak "
                     f"{_gib(p['peak_memory_bytes'])}/GPU")
    m = job.get("metrics")
    if m and m.get("latest"):
        w = m["latest"]
        lines.append(f"  latest    step {_num(w['step'], '.0f')}  loss {_num(w['loss'], '.4f')}  "
                     f"{_num(w['tokens_per_s'], ',.0f')} tokens/s  step "
                     f"{_num(w['step_time_s'], '.3f', ' s')} (predicted "
                     f"{_num(w['predicted_step_time_s'], '.3f', ' s')})")
        losses = [x["loss"] for x in m["windows"] if x.get("loss") is not None]
        if losses:
            lines.append(f"  loss      {sparkline(losses[-60:])}  "
                         f"{losses[max(0, len(losses) - 60)]:.4f} -> {losses[-1]:.4f}")
    lines += _memory_lines(job.get("memory"))
    for note in job.get("notes") or []:
        lines.append(f"  {note}")
    return lines


def _size(n: float) -> str:
    return _gib(n) if n >= 1 << 30 else f"{n / (1 << 20):.1f} MiB"


def _memory_lines(mem: dict[str, Any] | None) -> list[str]:
    """The job's measured memory beside the prediction, and its out-of-memory runs."""
    if not mem:
        return []
    out = []
    measured, pred = mem.get("measured_tensors_bytes"), mem.get("predicted_tensors_bytes")
    if measured is not None:
        err = mem.get("error_pct")
        out.append(f"  memory    {_size(measured)}/rank measured ({mem.get('source')}), "
                   f"predicted {_size(pred) if pred is not None else '-'}"
                   + (f" ({err:+.1f} %)" if err is not None else ""))
    if mem.get("out_of_memory_runs"):
        out.append(f"  oom       {mem['out_of_memory_runs']} run(s), memory "
                   f"x{mem.get('memory_factor', 1.0):.2f} since: {mem.get('last_out_of_memory')}")
    return out


@_guard
def run_jobs(args: argparse.Namespace) -> int:
    """``frenzy jobs``: a table of jobs; ``frenzy jobs ID``: one job (``--json``: raw)."""
    job_id = args.job_id or args.id
    if job_id:
        job = _call("GET", f"/v1/jobs/{resolve_job_id(job_id)}")
        print(json.dumps(job, indent=2) if args.json else "\n".join(format_job(job)))
        return 0
    params: dict[str, Any] = {"limit": args.limit}
    if args.state:
        params["state"] = args.state
    page = _call("GET", "/v1/jobs", params=params)
    if args.json:
        print(json.dumps(page))
        return 0
    print(f"{'id':8s}  {'name':16s} {'owner':10s} {'model':14s} {'state':10s} "
          f"{'progress':>9s} {'duration':>9s} {'GPU-h':>8s}  reason")
    for j in page["data"]:
        prog = j["progress"]
        name = j.get("name") or "-"
        print(f"{j['id'][:8]:8s}  {name[:16]:16s} {j['owner'][:10]:10s} "
              f"{j['model_name'][:14]:14s} {j['state']:10s} {100 * prog['fraction']:8.1f}% "
              f"{_duration(j.get('duration_s')):>9s} {_num(j.get('gpu_hours'), '.2f'):>8s}  "
              f"{j['state_reason'][:60]}")
    print(f"({len(page['data'])} of {page['count']})")
    return 0


def _duration(seconds: float | None) -> str:
    """``1h02m``, ``4m05s``, ``12s``; ``-`` for none."""
    if seconds is None:
        return "-"
    s = round(seconds)
    if s >= 3600:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 60}m{s % 60:02d}s" if s >= 60 else f"{s}s"


@_guard
def run_resubmit(args: argparse.Namespace) -> int:
    """``frenzy resubmit ID``: the finished job's request as a new job."""
    job = _call("POST", f"/v1/jobs/{resolve_job_id(args.job_id)}/resubmit")
    print(f"{job['id']}  {job['state']}: {job['state_reason']} (resubmission of "
          f"{args.job_id})")
    return 0


@_guard
def run_cancel(args: argparse.Namespace) -> int:
    """``frenzy cancel ID``."""
    body = {"reason": args.reason} if args.reason else None
    job = _call("POST", f"/v1/jobs/{resolve_job_id(args.job_id)}/cancel", json=body)
    print(f"{job['id']}  {job['state']}: {job['state_reason']}")
    return 0


@_guard
def run_logs(args: argparse.Namespace) -> int:
    """Print a rank's output; with ``-f`` keep following it until the job ends."""
    if args.rank < 0:
        raise ClientError(f"--rank must be >= 0, got {args.rank}")
    try:
        stream_logs(resolve_job_id(args.job_id), args.rank, args.follow, sys.stdout.buffer)
    except BrokenPipeError:  # `frenzy logs ID | head`: quiet, as the Python docs advise
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    except KeyboardInterrupt:
        return 130
    return 0


@_guard
def run_status(args: argparse.Namespace) -> int:
    """``frenzy status``: nodes, GPUs in use and the queue."""
    cluster = _call("GET", "/v1/cluster")
    jobs = _call("GET", "/v1/jobs", params={"limit": 1})
    queue = _call("GET", "/v1/cluster/queue")["data"]
    if args.json:
        print(json.dumps({"cluster": cluster, "jobs": jobs["count"], "queue": queue}))
        return 0
    print(f"{cluster['used_gpus']}/{cluster['total_gpus']} GPUs in use, {jobs['count']} jobs")
    for n in cluster["nodes"]:
        holders = ", ".join(f"{(h['job_id'] or 'other')[:8]}:{h['gpus']}"
                            for h in n["holders"]) or "-"
        print(f"  {n['id']:12s} {n['gpu_type']:10s} {n['used_gpus']}/{n['total_gpus']}  "
              f"{holders}")
    print(f"queue: {len(queue)} job{'s' if len(queue) != 1 else ''}")
    for e in queue:
        who = (e["job_id"] or "")[:8] or f"({e['owner'] or 'another user'})"
        print(f"  {e['position']:>3}. {who:10s} [{e['waiting']['kind']}] "
              f"{e['waiting']['message']}")
    return 0
