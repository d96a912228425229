"""Liveness, readiness and the Prometheus scrape endpoint."""

from __future__ import annotations

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from proxy.errors import StoreError
from proxy.keys import metrics_key, store_key


async def healthz(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


async def readyz(request: web.Request) -> web.Response:
    try:
        await request.app[store_key].ping()
    except StoreError as exc:
        return web.json_response({"status": "store unavailable", "detail": str(exc)}, status=503)
    return web.json_response({"status": "ready"})


async def metrics(request: web.Request) -> web.Response:
    metrics = request.app[metrics_key]
    metrics.measure_caches()
    body = generate_latest(metrics.registry)
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})
