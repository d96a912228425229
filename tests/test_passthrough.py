"""Every other /v1/* path goes upstream unchanged."""

from __future__ import annotations

import gzip

import orjson


async def test_method_query_headers_and_body_cross_unchanged(proxy) -> None:
    resp = await proxy.request("PUT", "/v1/echo/files/abc?purpose=fine-tune&x=1", data=b"\x00binary\xff",
                               headers={"Authorization": "Bearer k", "X-Custom": "yes", "Connection": "keep-alive"})
    assert resp.status == 200
    assert resp.headers["X-Upstream-Custom"] == "kept"
    seen = await resp.json()
    assert seen["method"] == "PUT"
    assert seen["path"] == "/v1/echo/files/abc"
    assert seen["query"] == {"purpose": "fine-tune", "x": "1"}
    assert seen["headers"]["X-Custom"] == "yes"
    assert seen["headers"]["Authorization"] == "Bearer k"
    assert seen["body"] == b"\x00binary\xff".decode("utf-8", "replace")


async def test_models_listing(proxy) -> None:
    resp = await proxy.get("/v1/models")
    assert resp.status == 200
    assert (await resp.json())["data"][0]["id"] == "fake-model"


async def test_session_prefix_also_passes_through(proxy) -> None:
    resp = await proxy.get("/s/run-1/v1/echo/embeddings")
    assert (await resp.json())["path"] == "/v1/echo/embeddings"
    assert resp.headers["X-Session-Id"] == "run-1"


async def test_compressed_body_is_relayed_compressed(proxy) -> None:
    resp = await proxy.get("/v1/gzipped", headers={"Accept-Encoding": "gzip"}, auto_decompress=False)
    assert resp.headers["Content-Encoding"] == "gzip"
    assert orjson.loads(gzip.decompress(await resp.read())) == {"compressed": True}


async def test_streamed_body_arrives_whole(proxy) -> None:
    resp = await proxy.get("/v1/stream")
    assert await resp.read() == b"part0;part1;part2;part3;part4;"


async def test_upstream_key_replaces_the_client_credential(make_proxy, fake) -> None:
    proxy = await make_proxy(upstream_key="sk-proxy-own")
    resp = await proxy.get("/v1/echo/x", headers={"Authorization": "Bearer sk-client"})
    assert (await resp.json())["headers"]["Authorization"] == "Bearer sk-proxy-own"
