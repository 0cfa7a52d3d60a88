"""Worker health speaks to Redis itself (core.runtime.redis_wire): the commands it needs, the
URL forms Redis users write, passwords, and clear errors; and a worker that serves queues
loads neither redis-py nor, through it, the OpenTelemetry SDK."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from core.runtime.redis_wire import RedisAddress, RedisReplyError, RedisWire
from tests.conftest import database_url

REDIS = "redis://127.0.0.1:6379/13"
REPO = Path(__file__).resolve().parent.parent


def test_setex_scan_mget_and_delete_round_trip():
    wire = RedisWire(REDIS)
    try:
        wire.setex("sluice-test:wire:a", 30, '{"name": "a"}')
        wire.setex("sluice-test:wire:b", 30, b"\x00binary\r\n")
        keys = sorted(wire.scan("sluice-test:wire:*"))
        assert keys == [b"sluice-test:wire:a", b"sluice-test:wire:b"]
        assert wire.mget(keys + [b"sluice-test:wire:none"]) == [b'{"name": "a"}', b"\x00binary\r\n", None]
        assert wire.command("TTL", "sluice-test:wire:a") <= 30
        wire.delete("sluice-test:wire:a")
        wire.delete("sluice-test:wire:b")
        assert wire.scan("sluice-test:wire:*") == []
        assert wire.mget([]) == []
    finally:
        wire.close()


def test_the_url_database_is_the_one_written():
    RedisWire("redis://127.0.0.1:6379/12").setex("sluice-test:wire:db", 30, "twelve")
    assert RedisWire("redis://127.0.0.1:6379?db=12").mget([b"sluice-test:wire:db"]) == [b"twelve"]
    assert RedisWire("redis://127.0.0.1:6379/11").mget([b"sluice-test:wire:db"]) == [None]
    RedisWire("redis://127.0.0.1:6379/12").delete("sluice-test:wire:db")


def test_a_lost_connection_is_opened_again_on_the_next_command():
    wire = RedisWire(REDIS)
    wire.setex("sluice-test:wire:again", 30, "1")
    RedisWire(REDIS).command("CLIENT", "KILL", "ID", wire.command("CLIENT", "ID"))  # only this one
    with pytest.raises(OSError):
        wire.mget([b"sluice-test:wire:again"])
    assert wire.mget([b"sluice-test:wire:again"]) == [b"1"]
    wire.delete("sluice-test:wire:again")


def test_nothing_listening_is_an_os_error():
    with pytest.raises(OSError):
        RedisWire("redis://127.0.0.1:1/0").setex("k", 1, "v")


def test_a_redis_error_is_raised_with_redis_words_and_the_connection_goes_on():
    wire = RedisWire(REDIS)
    with pytest.raises(RedisReplyError, match="unknown command"):
        wire.command("NOSUCHCOMMAND")
    assert wire.command("PING") == b"PONG"


@pytest.mark.parametrize("url, expected", [
    ("redis://localhost", RedisAddress()),
    ("redis://:s%40cret@cache.internal:6380/3", RedisAddress(host="cache.internal", port=6380, db=3, password="s@cret")),
    ("redis://worker:pw@10.0.0.5/0", RedisAddress(host="10.0.0.5", username="worker", password="pw")),
    ("redis://h?db=5&password=pw", RedisAddress(host="h", db=5, password="pw")),
    ("rediss://h:6390/1?ssl_cert_reqs=none", RedisAddress(host="h", port=6390, db=1, tls=True, verify=False)),
    ("rediss://h?ssl_ca_certs=/etc/ca.pem", RedisAddress(host="h", tls=True, ca_file="/etc/ca.pem")),
    ("unix:///run/redis/redis.sock?db=2", RedisAddress(path="/run/redis/redis.sock", db=2)),
])
def test_url_forms(url, expected):
    assert RedisAddress.parse(url) == expected


@pytest.mark.parametrize("url, words", [
    ("http://localhost:6379", "starts with redis://, rediss:// or unix://"),
    ("redis://localhost/zero", "must be a number, not 'zero'"),
    ("redis://localhost:port", "not a port number"),
    ("unix://", "needs the socket's path"),
])
def test_bad_urls_say_what_is_wrong(url, words):
    with pytest.raises(ValueError, match=words):
        RedisWire(url)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def redis_with_password(tmp_path):
    """A Redis of this test's own that asks for a password (and a user with one)."""
    port = _free_port()
    server = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                               "--appendonly", "no", "--requirepass", "s3cret", "--dir", str(tmp_path)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        RedisWire(f"redis://:s3cret@127.0.0.1:{port}").command(
            "ACL", "SETUSER", "health", "on", ">h3alth", "~sluice:*", "+@all")
        yield port
    finally:
        server.terminate()
        server.wait(10)


def test_passwords_and_users_are_sent(redis_with_password):
    port = redis_with_password
    RedisWire(f"redis://:s3cret@127.0.0.1:{port}/2").setex("sluice:worker:x", 30, "up")
    assert RedisWire(f"redis://health:h3alth@127.0.0.1:{port}/2").scan("sluice:worker:*") == [b"sluice:worker:x"]
    with pytest.raises(RedisReplyError, match="WRONGPASS|invalid"):
        RedisWire(f"redis://:wrong@127.0.0.1:{port}").command("PING")
    with pytest.raises(RedisReplyError, match="NOAUTH"):
        RedisWire(f"redis://127.0.0.1:{port}").command("PING")


def test_a_worker_serving_queues_loads_neither_redis_py_nor_the_opentelemetry_sdk(demo):
    """With tracing off; the dashboard's pages and API stay unloaded too."""
    probe = (
        "import django, sys; django.setup()\n"
        "import core.cli.worker\n"
        "from core.worker import WorkerHost\n"
        "from core.runtime.health import HealthPublisher\n"
        f"host = WorkerHost(queues=['demo'], redis_url={REDIS!r})\n"
        "publisher = next(loop for loop in host.runner.loops if isinstance(loop, HealthPublisher))\n"
        "publisher.step(); publisher.close()\n"
        "loaded = sorted(m for m in sys.modules if m.split('.')[0] in ('redis', 'opentelemetry', 'rest_framework',"
        " 'drf_spectacular') or m.startswith(('opentelemetry.sdk', 'dashboard.views', 'dashboard.api')))\n"
        "print(loaded)\n")
    env = {**os.environ, "DATABASE_URL": database_url(), "SLUICE_OTEL": "0", "DJANGO_SETTINGS_MODULE": "sluice.settings"}
    result = subprocess.run([sys.executable, "-c", probe], cwd=REPO, env=env, capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr
    loaded = eval(result.stdout.strip().splitlines()[-1])  # noqa: S307 — our own probe's list of names
    assert not [m for m in loaded if m.startswith(("redis", "opentelemetry.sdk", "dashboard.views", "dashboard.api"))]
