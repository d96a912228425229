"""``ctxproxy demo`` as a user runs it: a child process, no key, no network beyond loopback.

The child runs under an audit hook (``NETWORK_AUDIT``) that reports, and
refuses, every connection, datagram and name lookup for anything but a loopback
address, so a demo that reached for the network (a model map or tokenizer
download, a default upstream) fails here. Its state directory is the test's
(``HOME``), so the default demo store is checked to be the demo's own file.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import orjson

from proxy.ui.signinlinks import LIFETIME, SignInLinks

ROOT = Path(__file__).resolve().parent.parent
#: Runs ``python3 -m proxy ARGS`` with every non-loopback socket use reported on stderr and refused.
NETWORK_AUDIT = """
import ipaddress, runpy, sys

def loopback(host):
    if isinstance(host, bytes):
        host = host.decode()
    if host in (None, "localhost"):
        return True
    try:
        return ipaddress.ip_address(str(host).split("%")[0]).is_loopback
    except ValueError:
        return False

def audit(event, args):
    if event == "socket.getaddrinfo":
        host = args[0]
    elif event in ("socket.connect", "socket.sendto") and isinstance(args[-1], tuple):
        host = args[-1][0]
    else:
        return
    if not loopback(host):
        sys.stderr.write(f"NETWORK: {event} {host}\\n")
        raise OSError(f"the demo may not reach {host}")

sys.addaudithook(audit)
sys.argv = ["ctxproxy", *sys.argv[1:]]
runpy.run_module("proxy", run_name="__main__", alter_sys=True)
"""
LINK = re.compile(r"(http://127\.0\.0\.1:\d+/ui/once/[A-Za-z0-9_-]+)")


def demo_env(home: Path) -> dict[str, str]:
    """The user's environment without ctxproxy's settings or any proxy, and the test's home (its state dir)."""
    keep = {k: v for k, v in os.environ.items() if not k.startswith("CTXPROXY_") and "proxy" not in k.lower()
            and not k.startswith("XDG_")}
    return {**keep, "HOME": str(home), "PYTHONPATH": str(ROOT)}


def demo_argv(*args: str) -> list[str]:
    return [sys.executable, "-c", NETWORK_AUDIT, "demo", *args]


def report_json(stdout: str) -> dict[str, Any]:
    result = orjson.loads(stdout.strip().splitlines()[-1])
    assert isinstance(result, dict)
    return result


async def test_the_demo_compacts_with_every_tier_offline_and_reports_it(tmp_path: Path) -> None:
    proc = await asyncio.create_subprocess_exec(*demo_argv("--no-serve", "--json"), cwd=tmp_path,
                                                env=demo_env(tmp_path), stdout=asyncio.subprocess.PIPE,
                                                stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 120)
    stdout, stderr = out.decode(), err.decode()
    assert proc.returncode == 0, stderr
    assert "NETWORK:" not in stderr and "Traceback" not in stderr, stderr
    figures = report_json(stdout)
    assert figures["requests"] == 37
    assert figures["masking"] >= 1 and figures["summaries"] >= 1 and figures["model_free"] >= 1, figures
    assert figures["client_tokens"] > 2 * figures["model_tokens"] > 0, figures
    assert figures["constraint_kept"] is True and figures["edit_kept"] is True
    free = figures["model_free"]
    batches = figures["masking"]
    assert f"{batches} masking batch{'' if batches == 1 else 'es'} (" in stdout
    assert f"{free} model-free checkpoint{'' if free == 1 else 's'} (" in stdout
    assert "the user's constraint verbatim: yes" in stdout and "the current text of app/cli.py: yes" in stdout
    # The demo's own store in the user's state dir, never the one serve and run use.
    state = tmp_path / ".local" / "state" / "ctxproxy"
    assert (state / "demo.db").is_file() and not (state / "facts.db").exists()
    listed = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "proxy", "sessions", "list", "--json", "--store", f"sqlite:///{state}/demo.db",
        cwd=ROOT, env=demo_env(tmp_path), stdout=asyncio.subprocess.PIPE)
    sessions = orjson.loads((await listed.communicate())[0])
    assert [s["session"] for s in sessions] == [figures["session"]]


@asynccontextmanager
async def serving_demo(tmp_path: Path) -> AsyncIterator[tuple[str, dict[str, object]]]:
    """The demo serving its inspector: the printed sign-in link and the report's figures; ended with Ctrl-C
    (SIGINT), which must end it at once with status 0."""
    proc = await asyncio.create_subprocess_exec(*demo_argv("--store", f"sqlite:///{tmp_path}/demo.db", "--json"),
                                                cwd=tmp_path, env=demo_env(tmp_path), stdout=asyncio.subprocess.PIPE,
                                                stderr=asyncio.subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    lines: list[str] = []
    try:
        while not (found := LINK.search(lines[-1] if lines else "")):
            line = await asyncio.wait_for(proc.stdout.readline(), 120)
            assert line, "the demo ended before printing a sign-in link"
            lines.append(line.decode())
        figures = next(orjson.loads(line) for line in lines if line.startswith("{"))
        yield found.group(1), figures
        proc.send_signal(signal.SIGINT)
        assert await asyncio.wait_for(proc.wait(), 20) == 0
        stderr = (await proc.stderr.read()).decode()
        assert "NETWORK:" not in stderr and "Traceback" not in stderr, stderr
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


async def test_the_demo_serves_its_session_in_the_inspector_behind_a_one_time_link(tmp_path: Path) -> None:
    async with serving_demo(tmp_path) as (link, figures), aiohttp.ClientSession(
            cookie_jar=aiohttp.CookieJar(unsafe=True)) as browser:
        async with browser.get(link) as resp:
            assert resp.status == 200
            assert resp.url.path == f"/ui/sessions/{figures['tenant']}/{figures['session']}"
            assert f"<title>{figures['session']} (" in await resp.text()
        async with browser.get(str(resp.url.with_path("/ui"))) as listing:  # signed in: the cookie holds
            assert listing.status == 200 and str(figures["session"]) in await listing.text()


async def test_a_sign_in_link_signs_in_once(tmp_path: Path) -> None:
    async with serving_demo(tmp_path) as (link, _), aiohttp.ClientSession(
            cookie_jar=aiohttp.CookieJar(unsafe=True)) as first, aiohttp.ClientSession(
            cookie_jar=aiohttp.CookieJar(unsafe=True)) as second:
        async with first.get(link) as resp:
            assert resp.status == 200
        async with second.get(link) as spent:
            assert spent.status == 403 and "used already or has expired" in await spent.text()
        async with second.get(link.split("/ui/")[0] + "/ui", allow_redirects=False) as page:
            assert page.status == 303 and page.headers["Location"].startswith("/ui/signin")


def test_a_link_lapses_after_its_lifetime_and_an_unknown_one_leads_nowhere() -> None:
    now = [1000.0]
    links = SignInLinks(clock=lambda: now[0])
    token, kept = links.issue("/ui/sessions/t/s"), links.issue("/ui")
    assert links.redeem("not-a-token") is None
    now[0] += LIFETIME - 1
    assert links.redeem(kept) == "/ui"
    now[0] += 2
    assert links.redeem(token) is None

