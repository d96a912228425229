"""The start-up line names every upstream, the store without its password, where the inspector is, and tracing."""

from __future__ import annotations

from pathlib import Path

from proxy.settings import Secret, Settings
from proxy.startup import startup_line
from tests.proxyproc import ProxyProcess

PASSWORD = "hunter2-redis"


def test_the_line_names_every_upstream_the_store_without_its_password_and_the_inspector() -> None:
    settings = Settings(host="0.0.0.0", port=9000, upstream="https://llm.example/v1",
                        anthropic_upstream="https://claude.example", gemini_upstream="https://gemini.example",
                        store=f"redis://default:{PASSWORD}@redis.internal:6379/0", admin_token=Secret("t" * 20))
    assert startup_line(settings, environ={}) == (
        "ctxproxy listening on http://0.0.0.0:9000; upstreams: openai https://llm.example/v1, anthropic "
        "https://claude.example, gemini https://gemini.example; store redis://default:***@redis.internal:6379/0; "
        "inspector http://0.0.0.0:9000/ui")


def test_without_an_admin_token_it_says_how_to_turn_the_inspector_on_and_it_names_where_spans_go() -> None:
    line = startup_line(Settings(host="::1", store="sqlite:////var/lib/ctxproxy/facts.db"), workers=4,
                        environ={"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"})
    assert line.startswith("ctxproxy listening on http://[::1]:8787 with 4 workers; upstreams: openai "
                           "https://api.openai.com/v1, anthropic https://api.anthropic.com, gemini "
                           "https://generativelanguage.googleapis.com; store sqlite:////var/lib/ctxproxy/facts.db; ")
    assert line.endswith("; inspector off: pass --admin-token; tracing to http://collector:4318")
    assert startup_line(Settings(otel=True), environ={"OTEL_TRACES_EXPORTER": "console"}).endswith(
        "; tracing to console")
    assert startup_line(Settings(otel=True), environ={}).endswith("; tracing to http://localhost:4318")


async def test_serve_logs_the_line_as_it_starts(tmp_path: Path) -> None:
    store = f"sqlite:///{tmp_path}/facts.db"
    token = "admin-token-for-the-startup-line"
    args = ["--admin-token", token, "--gemini-upstream", "http://127.0.0.1:2"]
    async with ProxyProcess("http://127.0.0.1:1/v1", store, tmp_path, args) as proxy:
        log = proxy.log_bytes().decode()
    [line] = [line for line in log.splitlines() if "ctxproxy listening on" in line]
    assert line.endswith(f"ctxproxy listening on {proxy.url}; upstreams: openai http://127.0.0.1:1/v1, anthropic "
                         f"https://api.anthropic.com, gemini http://127.0.0.1:2; store {store}; "
                         f"inspector {proxy.url}/ui")
    assert token not in log
