"""The estimate of the view right after a masking batch is on the upstream's scale, like every other.

An upstream counts more than the proxy's measure (the wire format's framing, ids, thinking signatures); the usage
it reports calibrates the estimates of the views that follow on the same base. A batch starts a new base, and its
first view was estimated by the proxy's measure alone: 1,877 tokens where the upstream billed 6,748, then 6,933 on
the next request. Through the Messages door, a fake billing the serialised prompt as its tokenizer counts it, on a
simulated clock (a client without breakpoints gets its batch mid-run, ``tests/test_tail_cache.py``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from proxy.constants import HEADER_COMPACTED, HEADER_VIEW_TOKENS
from proxy.keys import store_key
from proxy.sessions import tenant_of
from proxy.store.base import SessionKey
from tests.fakemessages import FakeMessages
from tests.fakescript import Script
from tests.proxyfixtures import read_log
from tests.scripted import KEY, Claude
from tests.test_tail_cache import STEPS, clocked
from tests.test_worth import PACE

#: How far an estimate may sit from what the upstream billed: the tokens the proxy's measure leaves out of one step.
TOLERANCE = 0.05


def billed(usage: dict[str, Any]) -> int:
    """The prompt tokens a Messages reply billed, cached or not."""
    return int(usage["input_tokens"] + usage["cache_creation_input_tokens"] + usage["cache_read_input_tokens"])


async def test_the_view_after_a_masking_batch_is_estimated_as_the_upstream_counts_it(
        aiohttp_server, aiohttp_client, tmp_path: Path) -> None:
    """The request that carries the batch and the next: the view's estimate (``X-Ctxproxy-View-Tokens``) within 5 %
    of what the fake billed for it, and so is the batch's checkpoint's ``tokens_after`` (the inspector's "before →
    after"), which compared an upstream-scale figure before with the proxy's count after."""
    fake = FakeMessages(Script(steps=STEPS + 5))
    proxy, clock = await clocked(aiohttp_server, aiohttp_client, tmp_path, fake, context_window=16_000,
                                 keep_tool_outputs=2)
    client = Claude(proxy)
    steps: list[tuple[str, int, int]] = []  # (compacted, estimate, billed) per request
    for _ in range(STEPS):
        clock.now += PACE
        resp = await client.step()
        steps.append((resp.headers[HEADER_COMPACTED], int(resp.headers[HEADER_VIEW_TOKENS]),
                      billed(fake.turns()[-1].usage)))
        if len(steps) > 1 and steps[-2][0] == "proactive":
            break
    batch = next(i for i, (compacted, _, _) in enumerate(steps) if compacted == "proactive")
    assert batch + 1 < len(steps), steps
    for compacted, estimate, paid in steps[batch:batch + 2]:
        assert abs(estimate - paid) <= paid * TOLERANCE, (compacted, estimate, paid)
    facts = await read_log(proxy.server.app[store_key], SessionKey(tenant_of(KEY), client.session))
    checkpoint = next(f.extra["checkpoint"] for f in facts if f.kind == "checkpoint")
    assert abs(checkpoint["tokens_after"] - steps[batch][2]) <= steps[batch][2] * TOLERANCE, checkpoint
    assert checkpoint["tokens_before"] > checkpoint["tokens_after"]
