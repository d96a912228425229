"""A user's mistakes say what to do, in one line: at start-up where they can be known, then at run time.

Start-up mistakes run ``python3 -m proxy serve`` as a user would and read its
stderr: exactly one line naming the problem and the fix, no traceback, exit
status 2. Run-time ones go through a proxy to a closed port or a fake upstream
that answers 404.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import web
from click.testing import CliRunner

from proxy.app import create_app
from proxy.cli import main
from proxy.preflight import Upstream, suspicion
from proxy.settings import Settings
from tests.proxyproc import ROOT, ProxyProcess
from tests.redisproc import free_port
from tests.test_error_shapes import assert_anthropic_error
from tests.test_errors import _closed_port, assert_openai_error
from tests.test_launch import launcher

CHAT = orjson.dumps({"model": "m", "messages": [{"role": "user", "content": "x"}]})
MESSAGES = orjson.dumps({"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "x"}]})


def serve(*args: str) -> tuple[int, list[str]]:
    """``ctxproxy serve ARGS`` run to its end: its exit status and its stderr's lines (nothing may be on stdout)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CTXPROXY_")}
    command = [sys.executable, "-m", "proxy", "serve", "--host", "127.0.0.1", *args]
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, timeout=60)
    assert done.stdout == b""
    stderr = done.stderr.decode()
    assert "Traceback" not in stderr and "listening on" not in stderr, stderr
    return done.returncode, stderr.splitlines()


def refused(*args: str) -> str:
    """The one line ``serve ARGS`` refused to start with (exit status 2)."""
    status, lines = serve(*args)
    assert status == 2 and len(lines) == 1, lines
    return lines[0]


def test_a_port_in_use_is_one_line_naming_it_and_the_flag(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        line = refused("--port", str(port), "--store", f"sqlite:///{tmp_path}/facts.db")
    assert line == f"Error: port {port} on 127.0.0.1 is in use: stop the other process or pass --port N"


def test_a_port_in_use_is_the_same_one_line_with_several_workers(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        line = refused("--workers", "2", "--port", str(port), "--store", f"sqlite:///{tmp_path}/facts.db")
    assert line == f"Error: port {port} on 127.0.0.1 is in use: stop the other process or pass --port N"


def test_an_unknown_store_scheme_is_one_line_naming_the_schemes_it_takes() -> None:
    line = refused("--port", str(free_port()), "--store", "mysql://admin:hunter2@db/facts")
    assert "--store 'mysql://admin:***@db/facts' is not a store URL" in line and "sqlite:///" in line
    assert "redis://" in line and "hunter2" not in line


def test_a_store_path_that_cannot_be_created_is_one_line_naming_it(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("a file where the store's directory would go")
    url = f"sqlite:///{tmp_path}/file/facts.db"
    line = refused("--port", str(free_port()), "--store", url)
    assert line.startswith(f"Error: cannot open the store {url} (file exists: {tmp_path}/file): ")
    assert "name another with --store" in line


def test_a_store_in_a_read_only_directory_is_one_line_naming_it(tmp_path: Path) -> None:
    """A directory nobody may write, root included (the tests run as root, who ignores permission bits): made
    immutable with chattr, as a read-only mount would be."""
    directory = tmp_path / "readonly"
    directory.mkdir()
    subprocess.run(["chattr", "+i", str(directory)], check=True)
    try:
        url = f"sqlite:///{directory}/facts.db"
        line = refused("--port", str(free_port()), "--store", url)
    finally:
        subprocess.run(["chattr", "-i", str(directory)], check=True)
    assert line.startswith(f"Error: cannot open the store {url}") and "name another with --store" in line, line


def test_a_redis_that_does_not_answer_refuses_the_start_unless_the_store_is_optional(tmp_path: Path) -> None:
    url = f"redis://:hunter2@127.0.0.1:{_closed_port()}/0"
    line = refused("--port", str(free_port()), "--store", url)
    assert line.startswith(f"Error: the store redis://:***@127.0.0.1:{url.rsplit(':', 1)[1]} does not answer "
                           "(connection refused): ")
    assert "--store-optional" in line and "hunter2" not in line


async def test_with_store_optional_it_serves_and_says_loudly_that_nothing_is_logged(tmp_path: Path) -> None:
    proxy = ProxyProcess("http://127.0.0.1:1/v1", f"redis://127.0.0.1:{_closed_port()}/0", tmp_path,
                         ["--store-optional"])
    async with proxy, aiohttp.ClientSession() as client, client.get(proxy.url + "/healthz") as resp:
        assert resp.status == 200
    log = proxy.log_bytes().decode()
    (warning,) = [line for line in log.splitlines() if "WARNING" in line]
    assert "does not answer" in warning and "NOT logged or compacted" in warning
    assert log.index("does not answer") < log.index("listening on")


def test_store_optional_is_a_flag_and_an_environment_variable() -> None:
    assert Settings.from_env({"CTXPROXY_STORE_OPTIONAL": "true"}).store_optional
    assert not Settings.from_env({}).store_optional
    help_text = CliRunner().invoke(main, ["serve", "--help"]).output
    assert "--store-optional" in help_text and "CTXPROXY_STORE_OPTIONAL" in help_text


@pytest.mark.parametrize("flag", ["--upstream", "--anthropic-upstream", "--gemini-upstream"])
def test_an_upstream_without_a_scheme_is_one_line_with_the_url_that_would_do(tmp_path: Path, flag: str) -> None:
    line = refused("--port", str(free_port()), "--store", f"sqlite:///{tmp_path}/facts.db",
                   flag, "127.0.0.1:18901/v1")
    assert line == f"Error: {flag} '127.0.0.1:18901/v1' has no scheme: write http://127.0.0.1:18901/v1 (or https://…)"


async def test_suspicious_upstream_paths_are_one_warning_each_naming_the_likely_fix(tmp_path: Path) -> None:
    async with ProxyProcess("http://127.0.0.1:1", f"sqlite:///{tmp_path}/facts.db", tmp_path,
                            ["--anthropic-upstream", "http://127.0.0.1:2/v1",
                             "--gemini-upstream", "http://127.0.0.1:3/v1beta/"]) as proxy:
        pass
    warnings = [line for line in proxy.log_bytes().decode().splitlines() if "WARNING" in line]
    assert len(warnings) == 3, warnings
    assert "--upstream http://127.0.0.1:1 has no version in its path" in warnings[0]
    assert warnings[0].endswith("want http://127.0.0.1:1/v1")
    assert "ends with /v1, which the proxy adds itself" in warnings[1]
    assert warnings[1].endswith("did you mean http://127.0.0.1:2?")
    assert warnings[2].endswith("did you mean http://127.0.0.1:3?")


@pytest.mark.parametrize(("flag", "url", "expected"), [
    ("--upstream", "https://api.openai.com/v1", None),
    ("--upstream", "http://vllm:8000/v1/", None),
    ("--upstream", "https://generativelanguage.googleapis.com/v1beta/openai", None),
    ("--upstream", "https://openrouter.ai/api/v1/v1", "has /v1 twice: did you mean https://openrouter.ai/api/v1?"),
    ("--anthropic-upstream", "https://api.anthropic.com", None),
    ("--anthropic-upstream", "https://gateway.example/anthropic", None),
    ("--gemini-upstream", "https://generativelanguage.googleapis.com/v1beta",
     "did you mean https://generativelanguage.googleapis.com?"),
])
def test_what_looks_suspicious_in_an_upstream_path(flag: str, url: str, expected: str | None) -> None:
    found = suspicion(Upstream(flag, url, flag != "--upstream"))
    assert found == expected if expected is None else found is not None and found.endswith(expected)


def test_run_with_a_redis_that_does_not_answer_is_the_same_one_line(tmp_path: Path) -> None:
    async def go() -> tuple[int | None, bytes, bytes]:
        proc = await launcher(tmp_path, "--store", f"redis://127.0.0.1:{_closed_port()}/0", "aider", "--", "exit")
        out, err = await asyncio.wait_for(proc.communicate(), 60)
        return proc.returncode, out, err

    status, out, err = asyncio.run(go())
    assert status == 2 and out == b"", "the agent never started"
    (line,) = err.decode().strip().splitlines()
    assert "does not answer" in line and "--store-optional" in line


@pytest.mark.parametrize(("path", "body"), [("/v1/chat/completions", CHAT), ("/v1/messages", MESSAGES)])
async def test_a_refused_connection_is_a_502_naming_the_host_and_the_cause(aiohttp_client: Any, tmp_path: Path,
                                                                          path: str, body: bytes) -> None:
    closed = f"127.0.0.1:{_closed_port()}"
    proxy = await aiohttp_client(create_app(Settings(upstream=f"http://{closed}/v1", anthropic_upstream=f"http://"
                                                     f"{closed}", store=f"sqlite:///{tmp_path}/f.db")))
    resp = await proxy.post(path, data=body)
    assert resp.status == 502
    answer = await resp.json()
    if path == "/v1/messages":
        assert_anthropic_error(answer, 502)
    else:
        assert_openai_error(answer, "upstream_error")
    assert answer["error"]["message"] == f"Could not connect to upstream {closed}: connection refused."


async def test_a_silent_upstream_is_a_504_naming_the_host_and_the_timeout(make_proxy: Any, fake: Any,
                                                                         upstream: Any) -> None:
    from tests.fakeupstream import Reply

    proxy = await make_proxy(upstream_timeout=0.2)
    never = asyncio.Event()
    fake.script.append(Reply(content="late", hang=never))
    resp = await proxy.post("/v1/chat/completions", data=CHAT)
    assert resp.status == 504
    message = (await resp.json())["error"]["message"]
    assert message == f"Upstream {upstream.host}:{upstream.port} did not answer within 0.2 s."
    never.set()


async def test_an_upstream_404_is_relayed_and_explained_once_in_the_log(aiohttp_client: Any, upstream: Any,
                                                                       store_url: str,
                                                                       caplog: pytest.LogCaptureFixture) -> None:
    root = str(upstream.make_url("/")).rstrip("/")  # the /v1 forgotten: the fake serves /v1/chat/completions
    proxy = await aiohttp_client(create_app(Settings(upstream=root, store=store_url)))
    caplog.set_level(logging.WARNING, logger="proxy.upstream")
    for _ in range(2):
        resp = await proxy.post("/v1/chat/completions", data=CHAT)
        assert resp.status == 404
        assert await resp.text() == "404: Not Found", "the upstream's answer, as it sent it"
    (record,) = [r for r in caplog.records if r.name == "proxy.upstream"]
    assert record.getMessage() == (f"upstream answered 404 to POST {root}/chat/completions: if that path is wrong, "
                                   "check --upstream (its path prefix: /v1 missing or doubled?)")


def models_app() -> web.Application:
    """An upstream for ``check`` to probe: OpenAI's and Anthropic's ``/v1/models`` (Anthropic's only with a version
    header) and Gemini's ``/v1beta/models``, which refuses a request without its key as Google's does."""

    async def models(request: web.Request) -> web.Response:
        if request.path == "/v1beta/models" and request.headers.get("x-goog-api-key") != "good-key":
            return web.json_response({"error": {"code": 403, "status": "PERMISSION_DENIED"}}, status=403)
        return web.json_response({"data": []})

    app = web.Application()
    app.router.add_get("/v1/models", models)
    app.router.add_get("/v1beta/models", models)
    return app


async def check(*args: str) -> tuple[int | None, str, str]:
    """``ctxproxy check ARGS`` as a user runs it: exit status, stdout, stderr."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CTXPROXY_")}
    proc = await asyncio.create_subprocess_exec(sys.executable, "-m", "proxy", "check", *args, cwd=ROOT, env=env,
                                                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    return proc.returncode, out.decode(), err.decode()


async def test_check_probes_each_upstream_and_says_where_requests_would_go(aiohttp_server: Any,
                                                                          tmp_path: Path) -> None:
    root = str((await aiohttp_server(models_app())).make_url("/")).rstrip("/")
    status, out, err = await check("--store", f"sqlite:///{tmp_path}/facts.db", "--upstream", root + "/v1",
                                   "--anthropic-upstream", root, "--gemini-upstream", root)
    assert (status, err) == (0, "")
    store, openai, anthropic, gemini = out.splitlines()
    assert store.endswith(": ok")
    assert openai == (f"--upstream {root}/v1: ok: GET {root}/v1/models answered 200; /v1/chat/completions goes to "
                      f"{root}/v1/chat/completions, /v1/responses to {root}/v1/responses")
    assert anthropic == (f"--anthropic-upstream {root}: ok: GET {root}/v1/models answered 200; /v1/messages goes "
                         f"to {root}/v1/messages")
    assert gemini.startswith(f"--gemini-upstream {root}: ok: GET {root}/v1beta/models answered 403 (no key "
                             "configured: the agent's own goes)")


async def test_check_names_a_wrong_path_a_closed_port_and_a_refused_key(aiohttp_server: Any, tmp_path: Path) -> None:
    root = str((await aiohttp_server(models_app())).make_url("/")).rstrip("/")
    closed = f"127.0.0.1:{_closed_port()}"
    status, out, err = await check("--store", f"sqlite:///{tmp_path}/facts.db", "--upstream", root,
                                   "--anthropic-upstream", f"http://{closed}", "--gemini-upstream", root,
                                   "--gemini-upstream-key", "wrong-key")
    assert status == 1 and out.splitlines()[0].endswith(": ok")
    openai, anthropic, gemini = err.splitlines()
    assert openai.startswith(f"--upstream {root}: failed: GET {root}/models answered 404: the path looks wrong "
                             "(/v1 missing or doubled?)")
    assert anthropic == (f"--anthropic-upstream http://{closed}: failed: Could not connect to upstream {closed}: "
                         "connection refused.")
    assert gemini == (f"--gemini-upstream {root}: failed: GET {root}/v1beta/models answered 403: it refuses the "
                      "configured key")
    assert "wrong-key" not in out + err
