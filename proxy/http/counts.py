"""Token counting endpoints, answered over the view the model would get, not the history the client sent.

- ``POST /v1/responses/input_tokens`` (Responses API) is answered here, from
  the proxy's own estimate of the view (``{"object": "response.input_tokens",
  "input_tokens": N}``): the upstream would count the uncompacted input.
- ``POST /v1/messages/count_tokens`` (Anthropic) is forwarded to the Anthropic
  upstream with ``messages`` replaced by the view, so Claude Code sees what the
  model will see, counted by the model's own tokenizer.

Neither compacts: counting is a question about the next request, and the next
request compacts if it must.
"""

from __future__ import annotations

import time

from aiohttp import web

from proxy.context.engine import PreparedView
from proxy.dialects import MESSAGES, RESPONSES
from proxy.http.frontdoor import Turn, open_turn
from proxy.http.relay import read_whole
from proxy.keys import client_key, metrics_key
from proxy.upstream import client_timeout, map_upstream_errors, request_headers, response_headers


def _view(turn: Turn) -> PreparedView:
    window = turn.engine.window_for(turn.parsed.model)
    return turn.engine.view(turn.parsed.items, turn.hashes, turn.state, dialect=turn.dialect, window=window,
                            tools=turn.parsed.tools, max_output=turn.max_output)


async def input_tokens(request: web.Request) -> web.StreamResponse:
    started = time.perf_counter()
    status = 500
    try:
        turn = await open_turn(request, RESPONSES)
        view = _view(turn)
        status = 200
        return web.json_response({"object": "response.input_tokens", "input_tokens": view.estimate.tokens},
                                 headers=turn.headers(view, started))
    finally:
        request.app[metrics_key].requests.labels(route="responses", status=str(status)).inc()


async def count_tokens(request: web.Request) -> web.StreamResponse:
    started = time.perf_counter()
    status = 502
    try:
        turn = await open_turn(request, MESSAGES)
        view = _view(turn)
        headers = request_headers(request.headers, turn.settings, identity=True, anthropic=True)
        url = MESSAGES.upstream_url(turn.settings, "/v1/messages/count_tokens")
        async with map_upstream_errors(), request.app[client_key].post(
                url, data=turn.upstream_body(view), headers=headers, params=request.rel_url.query,
                timeout=client_timeout(turn.settings)) as resp:
            raw = await read_whole(resp, turn.timing)
            status = resp.status
            out = response_headers(resp.headers, decoded=True)
            out.update(turn.headers(view, started))
            return web.Response(status=resp.status, headers=out, body=raw)
    finally:
        request.app[metrics_key].requests.labels(route="messages", status=str(status)).inc()

