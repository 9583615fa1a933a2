"""The control plane is closed by default: every port the embedded Ray cluster's processes
listen on is a loopback one, token auth is on, the token file is 0600, and a client without
the token (or with a wrong one) is refused while one with it gets in. The production set-up
(docker-compose.yml) has auth on, no fixed password and TLS in front of the API."""

from __future__ import annotations

import os
import socket
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from sqlalchemy.engine import make_url

from orchestrator import emulated
from orchestrator.emulated import RayCluster, start_emulated
from service.settings import Settings, SettingsError

ROOT = Path(__file__).resolve().parents[2]

SMALL = Path(__file__).parents[1] / "orchestrator" / "data" / "small-cluster.yaml"
JOIN = ("import sys, ray\n"
        "ray.init(address=sys.argv[1], log_to_driver=False)\n"
        "print('GPUS', ray.cluster_resources().get('GPU'), flush=True)\n")
KV = ("import sys\n"  # what an attacker's GCS client does: write and read the KV store
      "from ray._raylet import GcsClient\n"
      "g = GcsClient(address=sys.argv[1])\n"
      "g.internal_kv_put(b'frenzy-probe', b'1', True, None, timeout=5)\n"
      "print('KEYS', len(g.internal_kv_keys(b'', None, timeout=5)), flush=True)\n")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RayCluster]:
    saved = {k: os.environ.get(k)
             for k in ("RAY_ADDRESS", "FRENZY_RAY_TOKEN_FILE", "RAY_AUTH_TOKEN_PATH")}
    os.environ.pop("RAY_ADDRESS", None)
    os.environ.pop("RAY_AUTH_TOKEN_PATH", None)  # an earlier cluster in this process set it
    os.environ["FRENZY_RAY_TOKEN_FILE"] = str(tmp_path_factory.mktemp("ray") / "token")
    c = start_emulated(SMALL)
    try:
        yield c
    finally:
        c.shutdown()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _listening() -> dict[int, str]:
    """Socket inode → local address of every listening TCP socket on this machine."""
    out: dict[int, str] = {}
    for name, family in (("tcp", socket.AF_INET), ("tcp6", socket.AF_INET6)):
        for line in Path(f"/proc/net/{name}").read_text().splitlines()[1:]:
            f = line.split()
            if f[3] != "0A":  # TCP_LISTEN
                continue
            hex_ip, hex_port = f[1].split(":")
            raw = bytes.fromhex(hex_ip)
            # /proc prints the address as 32-bit words in host (little-endian) order
            raw = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
            out[int(f[9])] = f"{socket.inet_ntop(family, raw)}:{int(hex_port, 16)}"
    return out


def _sockets_of(pid: int) -> set[int]:
    inodes = set()
    try:
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            link = os.readlink(fd)
            if link.startswith("socket:["):
                inodes.add(int(link[8:-1]))
    except OSError:
        pass
    return inodes


def _join(address: str, env: dict[str, str],
          script: str = KV) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    return subprocess.run([sys.executable, "-c", script, address], env={**base, **env},
                          capture_output=True, text=True, timeout=120)


@pytest.mark.ray
def test_no_port_of_the_cluster_listens_beyond_loopback(cluster: RayCluster) -> None:
    import ray

    @ray.remote(num_cpus=0)
    def hello() -> int:  # brings up a worker process too
        return os.getpid()

    assert ray.get(hello.remote()) > 0
    assert cluster.temp_dir is not None
    pids = set(emulated.cluster_processes(cluster.temp_dir)) | {os.getpid()}
    listening = _listening()
    ours = {pid: [listening[i] for i in _sockets_of(pid) if i in listening] for pid in pids}
    addresses = [a for found in ours.values() for a in found]
    assert len(addresses) >= 5, ours  # GCS, raylets, agents, workers: they were looked at
    loopback = ("127.0.0.1", "::1", "::ffff:127.0.0.1")
    exposed = [a for a in addresses if a.rsplit(":", 1)[0] not in loopback]
    assert exposed == [], f"listening beyond loopback: {exposed}"
    assert cluster.address.startswith("127.0.0.1:")


@pytest.mark.ray
def test_auth_is_on_and_a_client_without_the_token_is_refused(cluster: RayCluster) -> None:
    token = emulated.ray_auth_token_file()
    assert token == Path(os.environ["FRENZY_RAY_TOKEN_FILE"])
    assert stat.S_IMODE(token.stat().st_mode) == 0o600 and len(token.read_text()) == 64
    assert os.environ["RAY_AUTH_MODE"] == "token"
    loopback = {emulated.SINGLE_MACHINE_ENV: "0"}
    no_token = _join(cluster.address, {**loopback, "RAY_AUTH_MODE": "disabled"})
    assert no_token.returncode != 0 and "AuthenticationError" in no_token.stderr, \
        no_token.stderr[-2000:]
    wrong = _join(cluster.address, {**loopback, "RAY_AUTH_MODE": "token",
                                    "RAY_AUTH_TOKEN": "0" * 64})
    assert wrong.returncode != 0 and "AuthenticationError" in wrong.stderr, wrong.stderr[-2000:]
    # the same clients with the token get in: the refusals above were the token's doing
    ok = _join(cluster.address, emulated.client_env())
    assert ok.returncode == 0 and "KEYS" in ok.stdout, ok.stderr[-2000:]
    driver = _join(cluster.address, emulated.client_env(), JOIN)
    assert driver.returncode == 0 and "GPUS 3.0" in driver.stdout, driver.stderr[-2000:]


def test_an_existing_token_file_is_reused_and_tightened(tmp_path: Path) -> None:
    path = tmp_path / "t"
    emulated.ensure_ray_auth_token(path)
    first = path.read_text()
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    os.chmod(path, 0o644)
    emulated.ensure_ray_auth_token(path)
    assert path.read_text() == first and stat.S_IMODE(path.stat().st_mode) == 0o600
    path.write_text("")
    with pytest.raises(ValueError, match="empty"):
        emulated.ensure_ray_auth_token(path)


def test_the_database_password_comes_from_a_file(tmp_path: Path) -> None:
    secret = tmp_path / "pw"
    secret.write_text("s3cr3t-from-file\n")
    env = {"DATABASE_URL": "postgresql://frenzy@postgres:5432/frenzy",
           "DATABASE_PASSWORD_FILE": str(secret)}
    url = make_url(Settings.from_env(env).database_url)
    assert (url.drivername, url.username, url.password, url.host, url.database) == (
        "postgresql+psycopg", "frenzy", "s3cr3t-from-file", "postgres", "frenzy")
    secret.write_text("  \n")
    with pytest.raises(SettingsError, match=r"DATABASE_PASSWORD_FILE: .* is empty"):
        Settings.from_env(env)
    with pytest.raises(SettingsError, match="DATABASE_PASSWORD_FILE: cannot read"):
        Settings.from_env({**env, "DATABASE_PASSWORD_FILE": str(tmp_path / "missing")})


def test_compose_has_auth_on_no_fixed_password_and_tls_in_front() -> None:
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    services = compose["services"]
    for name, svc in services.items():
        env = svc.get("environment") or {}
        for key, value in env.items():
            if "PASSWORD" in key:
                assert key.endswith("_FILE"), f"{name}: {key} holds a password"
            if key in ("DATABASE_URL",):
                assert make_url(value).password is None, f"{name}: password in {key}"
            if key == "RAY_AUTH_MODE":
                assert value == "token", name
        if any(str(c).startswith("ray") for c in svc.get("command") or []) or \
                "RAY_ADDRESS" in env:
            assert env.get("RAY_AUTH_MODE") == "token", f"{name}: Ray auth not on"
            assert "ray_auth_token" in svc.get("secrets", []), name
        assert not any("0.0.0.0" in str(c) for c in svc.get("command") or []
                       if str(c).startswith("--dashboard-host")), name
    secrets = compose["secrets"]
    assert all("file" in s for s in secrets.values())
    # only the TLS proxy is published; the API is reached through it
    published = {n for n, svc in services.items() if svc.get("ports")}
    assert published == {"proxy"}
    assert "443:443" in services["proxy"]["ports"]
    caddyfile = next(v.split(":")[0] for v in services["proxy"]["volumes"]
                     if v.endswith("/etc/caddy/Caddyfile:ro"))
    text = (ROOT / caddyfile).read_text()
    assert "reverse_proxy api:8000" in text and "{$FRENZY_HOSTNAME" in text
