"""Token counting endpoints, answered over the view the model would get, not the history the client sent.

- ``POST /v1/responses/input_tokens`` (Responses API) is answered here, from
  the proxy's own estimate of the view (``{"object": "response.input_tokens",
  "input_tokens": N}``): the upstream would count the uncompacted input.
- ``POST /v1/messages/count_tokens`` (Anthropic) is forwarded to the Anthropic
  upstream with ``messages`` replaced by the view, so Claude Code sees what the
  model will see, counted by the model's own tokenizer.

Neither compacts: counting is a question about the next request, and the next
request compacts if it must. A request that asks the upstream to compact or clear
its conversation itself is counted as sent, as it will go.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from aiohttp import web
from aiohttp.typedefs import Handler

from proxy.context.view.prepared import PreparedView
from proxy.dialects import MESSAGES, RESPONSES
from proxy.errors import ProxyError
from proxy.http import recall
from proxy.http.frontdoor import open_turn
from proxy.http.relay import read_whole
from proxy.http.turn import Turn
from proxy.keys import client_key, metrics_key
from proxy.upstream import client_timeout, map_upstream_errors, request_headers, response_headers


def view_of(turn: Turn) -> PreparedView:
    if turn.as_sent or turn.settings.shadow:  # counted as it will go: the upstream compacts or clears it itself,
        return turn.sent_view()  # or --shadow sends it as it is
    window = turn.engine.window_for(turn.parsed.model)
    return turn.engine.view(turn.parsed.items, turn.hashes, turn.state, dialect=turn.dialect, window=window,
                            tools=turn.parsed.fixed, max_output=turn.max_output, requester=turn.requester)


def counted(route: str) -> Callable[[Handler], Handler]:
    """Count a counting endpoint's requests under its API's route, with the status it answered (a refusal's too)."""

    def wrap(handler: Handler) -> Handler:
        async def count(request: web.Request) -> web.StreamResponse:
            status = 500
            try:
                response = await handler(request)
                status = response.status
                return response
            except ProxyError as exc:
                status = exc.status
                raise
            finally:
                request.app[metrics_key].request_served(route, status)

        return count

    return wrap


@counted(RESPONSES.name)
async def input_tokens(request: web.Request) -> web.StreamResponse:
    started = time.perf_counter()
    turn = await open_turn(request, RESPONSES)
    view = view_of(turn)
    return web.json_response({"object": "response.input_tokens", "input_tokens": view.estimate.tokens},
                             headers=turn.headers(view, started))


@counted(MESSAGES.name)
async def count_tokens(request: web.Request) -> web.StreamResponse:
    started = time.perf_counter()
    turn = await open_turn(request, MESSAGES)
    view = view_of(turn)
    headers = request_headers(request.headers, turn.settings, identity=True, anthropic=True)
    url = MESSAGES.upstream_url(turn.settings, "/v1/messages/count_tokens")
    async with map_upstream_errors(url, turn.settings), request.app[client_key].post(
            url, data=turn.upstream_body(view, recall.offer(turn, view)), headers=headers, params=request.rel_url.query,
            timeout=client_timeout(turn.settings)) as resp:
        raw = await read_whole(resp, turn.timing)
        out = response_headers(resp.headers, decoded=True)
        out.update(turn.headers(view, started))
        return web.Response(status=resp.status, headers=out, body=raw)
