"""Tests for proxy.sse, built from the OpenAI Chat Completions wire format.

Every stream below is what api.openai.com (or a common compatible server)
sends: one ``data: {json}`` line per chunk, a blank line after each, and
``data: [DONE]`` at the end.
"""

from __future__ import annotations

import itertools
import json
import random
from collections.abc import Iterable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.sse import (
    EventTooLarge,
    SSEEvent,
    SSESplitter,
    StreamAssembler,
    is_usage_only,
    message_from_completion,
    parse_event,
)

HEAD = '"id":"chatcmpl-B9MHDbslfkBeAs8l4bebGdFOJ6PeG","object":"chat.completion.chunk","created":1741570283,'
MODEL = '"model":"gpt-4o-mini-2024-07-18","service_tier":"default","system_fingerprint":"fp_06737a9306",'


def chunk(choice: str, usage: str = "null") -> str:
    return "{" + HEAD + MODEL + '"choices":[' + choice + '],"usage":' + usage + "}"


def delta(body: str, finish: str = "null") -> str:
    return chunk('{"index":0,"delta":' + body + ',"logprobs":null,"finish_reason":' + finish + "}")


USAGE = (
    '{"prompt_tokens":19,"completion_tokens":10,"total_tokens":29,'
    '"prompt_tokens_details":{"cached_tokens":0,"audio_tokens":0},'
    '"completion_tokens_details":{"reasoning_tokens":0,"audio_tokens":0,'
    '"accepted_prediction_tokens":0,"rejected_prediction_tokens":0}}'
)
USAGE_CHUNK = "{" + HEAD + MODEL + '"choices":[],"usage":' + USAGE + "}"

TEXT_CHUNKS = [
    delta('{"role":"assistant","content":"","refusal":null}'),
    delta('{"content":"Hello"}'),
    delta('{"content":"! Bonjour \u00e0 vous \U0001f44b"}'),
    delta('{"content":" How can I"}'),
    delta('{"content":" help?"}'),
    delta("{}", finish='"stop"'),
    USAGE_CHUNK,
    "[DONE]",
]

TOOL_CHUNKS = [
    delta(
        '{"role":"assistant","content":null,"tool_calls":[{"index":0,"id":"call_abc","type":"function",'
        '"function":{"name":"get_weather","arguments":""}}],"refusal":null}'
    ),
    delta(
        '{"tool_calls":[{"index":1,"id":"call_def","type":"function","function":{"name":"get_time","arguments":""}}]}'
    ),
    delta('{"tool_calls":[{"index":0,"function":{"arguments":"{\\"loc"}}]}'),
    delta('{"tool_calls":[{"index":1,"function":{"arguments":"{\\"tz\\":"}}]}'),
    delta('{"tool_calls":[{"index":0,"function":{"arguments":"ation\\": \\"Paris\\"}"}}]}'),
    delta('{"tool_calls":[{"index":1,"function":{"arguments":" \\"Europe/Paris\\"}"}}]}'),
    delta("{}", finish='"tool_calls"'),
    "[DONE]",
]

TOOL_CALLS = [
    {"id": "call_abc", "type": "function", "function": {"name": "get_weather", "arguments": '{"location": "Paris"}'}},
    {"id": "call_def", "type": "function", "function": {"name": "get_time", "arguments": '{"tz": "Europe/Paris"}'}},
]


def wire(payloads: Iterable[str], eol: bytes = b"\n") -> list[bytes]:
    """Raw events as the upstream writes them: ``data: <payload>`` then an empty line."""
    return [b"data: " + p.encode() + eol + eol for p in payloads]


TEXT_EVENTS = wire(TEXT_CHUNKS)
TOOL_EVENTS = wire(TOOL_CHUNKS)
COMMENTED_EVENTS = [
    b": OPENROUTER PROCESSING\n\n",
    *TEXT_EVENTS[:3],
    b": keep-alive\n\n",
    b"event: message\nid: 7\n: inline comment\ndata: " + TEXT_CHUNKS[3].encode() + b"\n\n",
    *TEXT_EVENTS[4:],
]
RECORDED = [TEXT_EVENTS, TOOL_EVENTS, COMMENTED_EVENTS]


def with_eol(events: list[bytes], eol: bytes) -> list[bytes]:
    """The same events with other line endings; JSON payloads hold no raw LF, so this is exact."""
    return [e.replace(b"\n", eol) for e in events]


def expected_split(events: list[bytes], eol: bytes) -> tuple[list[bytes], bytes]:
    """With bare CR line endings the final CR could still be half a CRLF, so the last event stays in flush()."""
    converted = with_eol(events, eol)
    return (converted[:-1], converted[-1]) if eol == b"\r" else (converted, b"")


def split_all(chunks: Iterable[bytes]) -> tuple[list[bytes], bytes]:
    splitter = SSESplitter()
    events: list[bytes] = []
    for piece in chunks:
        events.extend(splitter.feed(piece))
    return events, splitter.flush()


def cut(data: bytes, points: Iterable[int]) -> list[bytes]:
    bounds = [0, *sorted(points), len(data)]
    return [data[a:b] for a, b in itertools.pairwise(bounds)]


def byte_by_byte(data: bytes) -> list[bytes]:
    return [data[i : i + 1] for i in range(len(data))]


def assemble(events: Iterable[bytes]) -> StreamAssembler:
    """What the proxy does on the side of the relay."""
    assembler = StreamAssembler()
    for raw in events:
        event = parse_event(raw)
        if event is None or event.is_done:
            continue
        assembler.feed(event.json())
    return assembler


def reference_split(data: bytes) -> tuple[list[bytes], bytes]:
    """A deliberately naive whole-buffer splitter to check the incremental one against."""
    events: list[bytes] = []
    start = line_start = i = 0
    while i < len(data):
        byte = data[i : i + 1]
        if byte not in (b"\r", b"\n"):
            i += 1
            continue
        if byte == b"\r":
            if i + 1 == len(data):
                break  # CR or CRLF? undecided until more bytes come
            end = i + 2 if data[i + 1 : i + 2] == b"\n" else i + 1
        else:
            end = i + 1
        if i == line_start:
            events.append(data[start:end])
            start = end
        line_start = i = end
    return events, data[start:]


# --- SSESplitter ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("events", RECORDED, ids=["text", "tools", "comments"])
def test_split_whole_stream(events: list[bytes]) -> None:
    assert split_all([b"".join(events)]) == (events, b"")


@pytest.mark.parametrize("eol", [b"\n", b"\r\n", b"\r"], ids=["lf", "crlf", "cr"])
@pytest.mark.parametrize("events", RECORDED, ids=["text", "tools", "comments"])
def test_split_byte_by_byte(events: list[bytes], eol: bytes) -> None:
    expected = expected_split(events, eol)
    assert split_all(byte_by_byte(b"".join(with_eol(events, eol)))) == expected


@settings(database=None, deadline=None, max_examples=300)
@given(
    recorded=st.sampled_from(RECORDED),
    eol=st.sampled_from([b"\n", b"\r\n", b"\r"]),
    data=st.data(),
)
def test_split_any_chunking_of_recorded_stream(recorded: list[bytes], eol: bytes, data: st.DataObject) -> None:
    stream = b"".join(with_eol(recorded, eol))
    points = data.draw(st.sets(st.integers(0, len(stream)), max_size=60))
    events, tail = split_all(cut(stream, points))
    assert (events, tail) == expected_split(recorded, eol)
    assert b"".join(events) + tail == stream
    assert assemble([*events, tail]).message() == assemble(recorded).message()


@settings(database=None, deadline=None, max_examples=500)
@given(
    pieces=st.lists(
        st.sampled_from([b"data: x", b"event: e", b":c", b" ", b"\xc3\xa9", b"\r", b"\n", b"\r\n"]), max_size=40
    ),
    data=st.data(),
)
def test_split_any_bytes_any_chunking(pieces: list[bytes], data: st.DataObject) -> None:
    stream = b"".join(pieces)
    points = data.draw(st.sets(st.integers(0, len(stream)), max_size=20))
    events, tail = split_all(cut(stream, points))
    assert b"".join(events) + tail == stream
    assert (events, tail) == reference_split(stream)
    assert (events, tail) == split_all([stream])


def test_split_crlf_stream() -> None:
    stream = b"data: " + TEXT_CHUNKS[1].encode() + b"\r\n\r\n: ping\r\n\r\ndata: [DONE]\r\n\r\n"
    events, tail = split_all([stream[:7], stream[7:-3], stream[-3:]])
    assert events == [
        b"data: " + TEXT_CHUNKS[1].encode() + b"\r\n\r\n",
        b": ping\r\n\r\n",
        b"data: [DONE]\r\n\r\n",
    ]
    assert tail == b""
    assert parse_event(events[0]) == SSEEvent(data=TEXT_CHUNKS[1])
    assert parse_event(events[1]) is None


def test_split_lf_inside_crlf_is_not_a_blank_line() -> None:
    splitter = SSESplitter()
    assert splitter.feed(b"data: a\r") == []
    assert splitter.feed(b"\n") == []  # CRLF ends one line, it is not CR then an empty line
    assert splitter.feed(b"\r") == []
    assert splitter.feed(b"\ndata: b\n\n") == [b"data: a\r\n\r\n", b"data: b\n\n"]


def test_split_cr_only_event_waits_for_next_byte() -> None:
    splitter = SSESplitter()
    assert splitter.feed(b"data: a\r\r") == []  # the second CR may be the start of CRLF
    assert splitter.feed(b"d") == [b"data: a\r\r"]
    assert splitter.feed(b"ata: b\r\r") == []
    assert splitter.flush() == b"data: b\r\r"
    assert parse_event(b"data: b\r\r") == SSEEvent(data="b")


def test_split_mixed_line_endings() -> None:
    events, tail = split_all([b"data: a\r\n\ndata: b\n\r\ndata: c\r\r\ndata: d\n\r"])
    assert events == [b"data: a\r\n\n", b"data: b\n\r\n", b"data: c\r\r\n"]
    assert tail == b"data: d\n\r"


def test_split_several_events_in_one_chunk_and_emits_each_as_soon_as_complete() -> None:
    splitter = SSESplitter()
    assert splitter.feed(b"".join(TEXT_EVENTS[:3]) + TEXT_EVENTS[3][:10]) == TEXT_EVENTS[:3]
    assert splitter.buffered == 10
    assert splitter.feed(TEXT_EVENTS[3][10:]) == [TEXT_EVENTS[3]]
    assert splitter.buffered == 0
    assert splitter.feed(b"") == []


def test_split_comments_are_relayed_as_their_own_events() -> None:
    events, tail = split_all(byte_by_byte(b"".join(COMMENTED_EVENTS)))
    assert events == COMMENTED_EVENTS
    assert tail == b""
    assert [parse_event(e) is None for e in events[:6]] == [True, False, False, False, True, False]
    assert parse_event(events[5]) == SSEEvent(data=TEXT_CHUNKS[3], event="message", id="7")


def test_split_extra_blank_lines_become_empty_events() -> None:
    events, tail = split_all([b"\ndata: a\n\n\n\ndata: b\n\n"])
    assert events == [b"\n", b"data: a\n\n", b"\n", b"\n", b"data: b\n\n"]
    assert tail == b""
    assert [parse_event(e) for e in events] == [None, SSEEvent(data="a"), None, None, SSEEvent(data="b")]


def test_flush_returns_partial_tail_and_resets() -> None:
    splitter = SSESplitter()
    assert splitter.feed(TEXT_EVENTS[0] + b'data: {"id":') == [TEXT_EVENTS[0]]
    assert splitter.flush() == b'data: {"id":'
    assert splitter.flush() == b""
    assert splitter.feed(TEXT_EVENTS[1]) == [TEXT_EVENTS[1]]


def test_split_large_event_in_many_small_chunks() -> None:
    # 3 MB event in 100-byte chunks (the search resumes where it stopped, so this stays linear).
    splitter = SSESplitter()
    piece = b"data: " + b"x" * 93 + b"\n"
    for _ in range(30_000):
        assert splitter.feed(piece) == []
    assert splitter.buffered == len(piece) * 30_000
    assert splitter.feed(b"\n") == [piece * 30_000 + b"\n"]


@pytest.mark.parametrize("chunk_size", [1, 7, 100, 10_000])
def test_split_limit_bounds_an_event_that_never_ends(chunk_size: int) -> None:
    """An event without its blank line is refused once it is longer than the limit, whatever the chunking."""
    splitter = SSESplitter(limit=1000)
    stream = TEXT_EVENTS[0] + b"data: " + b"x" * 5000
    fed = 0
    with pytest.raises(EventTooLarge):
        while fed < len(stream):
            splitter.feed(stream[fed:fed + chunk_size])
            fed += chunk_size
    assert fed - chunk_size <= len(TEXT_EVENTS[0]) + 1000, "refused within one chunk of the limit"


def test_split_limit_counts_each_event_whole_and_allows_exactly_the_limit() -> None:
    event = b"data: " + b"y" * 993 + b"\n\n"
    assert len(event) == 1001
    assert SSESplitter(limit=1001).feed(event * 3) == [event] * 3
    with pytest.raises(EventTooLarge):
        SSESplitter(limit=1000).feed(event)  # complete within one chunk, and still too long
    with pytest.raises(EventTooLarge):
        SSESplitter(limit=1000).feed(TEXT_EVENTS[0] + event)


# --- parse_event -----------------------------------------------------------------------------------------------


def test_parse_joins_data_lines_with_lf() -> None:
    assert parse_event(b"data: first\ndata:second\ndata:  third\ndata\ndata: \n\n") == SSEEvent(
        data="first\nsecond\n third\n\n"
    )


def test_parse_event_name_id_retry() -> None:
    raw = b'event: error\r\nid: 42\r\nretry: 3000\r\ndata: {"error":{}}\r\n\r\n'
    assert parse_event(raw) == SSEEvent(data='{"error":{}}', event="error", id="42", retry=3000)
    assert parse_event(b"retry: 3s\ndata: x\n\n") == SSEEvent(data="x")


def test_parse_done() -> None:
    event = parse_event(TEXT_EVENTS[-1])
    assert event == SSEEvent(data="[DONE]")
    assert event is not None and event.is_done
    assert not SSEEvent(data=TEXT_CHUNKS[0]).is_done


def test_parse_without_data_dispatches_nothing() -> None:
    assert parse_event(b": keep-alive\n\n") is None
    assert parse_event(b"event: ping\n\n") is None
    assert parse_event(b"\n") is None
    assert parse_event(b"data:\n\n") == SSEEvent(data="")


def test_parse_tolerates_bom_and_bad_utf8() -> None:
    assert parse_event(b"\xef\xbb\xbfdata: a\n\n") == SSEEvent(data="a")
    assert parse_event(b"data: \xff\n\n") == SSEEvent(data="\ufffd")


def test_parse_json_payload() -> None:
    event = parse_event(TEXT_EVENTS[2])
    assert event is not None
    assert event.json()["choices"][0]["delta"] == {"content": "! Bonjour \u00e0 vous \U0001f44b"}


# --- StreamAssembler --------------------------------------------------------------------------------------------


def test_assemble_text_stream() -> None:
    assembler = assemble(TEXT_EVENTS)
    assert assembler.message() == {
        "role": "assistant",
        "content": "Hello! Bonjour \u00e0 vous \U0001f44b How can I help?",
    }
    assert assembler.finished
    assert assembler.finish_reason == "stop"
    assert assembler.usage == json.loads(USAGE)
    assert assembler.model == "gpt-4o-mini-2024-07-18"
    assert assembler.id == "chatcmpl-B9MHDbslfkBeAs8l4bebGdFOJ6PeG"
    assert assembler.error is None


def test_assemble_two_parallel_tool_calls_interleaved() -> None:
    assembler = assemble(TOOL_EVENTS)
    assert assembler.message() == {"role": "assistant", "content": None, "tool_calls": TOOL_CALLS}
    assert assembler.finish_reason == "tool_calls"
    assert assembler.usage is None


def test_assemble_tool_calls_sorted_by_index_not_arrival() -> None:
    order = [TOOL_EVENTS[1], TOOL_EVENTS[3], TOOL_EVENTS[5], TOOL_EVENTS[0], TOOL_EVENTS[2], TOOL_EVENTS[4]]
    message = assemble(order).message()
    assert message["tool_calls"] == TOOL_CALLS
    assert not assemble(order).finished


def test_assemble_reasoning_content_kept() -> None:
    events = wire(
        [
            delta('{"role":"assistant","content":null,"reasoning_content":""}'),
            delta('{"content":null,"reasoning_content":"9.11 vs 9.9:"}'),
            delta('{"content":null,"reasoning_content":" 0.90 > 0.11."}'),
            delta('{"content":"9.9","reasoning_content":null}'),
            delta('{"content":" is larger.","reasoning_content":null}'),
            delta('{"content":"","reasoning_content":null}', finish='"stop"'),
        ]
    )
    assert assemble(events).message() == {
        "role": "assistant",
        "content": "9.9 is larger.",
        "reasoning_content": "9.11 vs 9.9: 0.90 > 0.11.",
    }


def test_assemble_unknown_fields_verbatim() -> None:
    first_details = {"type": "reasoning.text", "text": "Think", "format": "unknown", "index": 0}
    second_details = {"type": "reasoning.text", "text": "ing.", "format": "unknown", "index": 0}
    chunks: list[dict[str, Any]] = [
        {"choices": [{"index": 0, "delta": {"role": "assistant", "content": "", "reasoning": "Think"}}]},
        {"choices": [{"index": 0, "delta": {"reasoning": "ing.", "reasoning_details": [first_details]}}]},
        {"choices": [{"index": 0, "delta": {"reasoning_details": [second_details], "meta": {"a": 1}, "n": 1}}]},
        {"choices": [{"index": 0, "delta": {"content": "ok", "meta": {"b": 2}, "n": 2, "flag": True}}]},
    ]
    assembler = StreamAssembler()
    for c in chunks:
        assembler.feed(c)
    assert assembler.message() == {
        "role": "assistant",
        "content": "ok",
        "reasoning": "Thinking.",
        "reasoning_details": [first_details, second_details],
        "meta": {"b": 2},
        "n": 2,
        "flag": True,
    }
    assert chunks[1]["choices"][0]["delta"]["reasoning_details"] == [first_details]  # input not mutated
    assert not assembler.finished


def test_assemble_refusal() -> None:
    events = wire(
        [
            delta('{"role":"assistant","content":null,"refusal":""}'),
            delta('{"refusal":"I\'m sorry, "}'),
            delta('{"refusal":"I can\'t assist with that."}'),
            delta("{}", finish='"stop"'),
            "[DONE]",
        ]
    )
    assert assemble(events).message() == {
        "role": "assistant",
        "content": None,
        "refusal": "I'm sorry, I can't assist with that.",
    }


def test_assemble_legacy_function_call() -> None:
    events = wire(
        [
            delta('{"role":"assistant","content":null,"function_call":{"name":"get_weather","arguments":""}}'),
            delta('{"function_call":{"arguments":"{\\"location\\":"}}'),
            delta('{"function_call":{"name":"get_weather","arguments":" \\"Paris\\"}"}}'),
            delta("{}", finish='"function_call"'),
        ]
    )
    assert assemble(events).message() == {
        "role": "assistant",
        "content": None,
        "function_call": {"name": "get_weather", "arguments": '{"location": "Paris"}'},
    }


def test_assemble_audio_fragments() -> None:
    assembler = StreamAssembler()
    assembler.feed(
        {"choices": [{"index": 0, "delta": {"role": "assistant", "audio": {"id": "audio_1", "data": "UklG"}}}]}
    )
    assembler.feed({"choices": [{"index": 0, "delta": {"audio": {"transcript": "Hi", "data": "RiQA"}}}]})
    assembler.feed({"choices": [{"index": 0, "delta": {"audio": {"id": "audio_1", "expires_at": 1729000000}}}]})
    assert assembler.message() == {
        "role": "assistant",
        "content": None,
        "audio": {"id": "audio_1", "data": "UklGRiQA", "transcript": "Hi", "expires_at": 1729000000},
    }


def test_assemble_tool_call_quirks() -> None:
    assembler = StreamAssembler()
    feeds: list[list[dict[str, Any]]] = [
        # no index at all: matched by id, or continuing the last call
        [{"id": "call_1", "type": "function", "function": {"name": "a", "arguments": "{"}}],
        [{"function": {"arguments": "}"}}],
        [{"id": "call_2", "function": {"name": "b", "arguments": "[]"}}],
        [{"id": "call_1", "function": {"name": "a"}}],
    ]
    for calls in feeds:
        assembler.feed({"choices": [{"index": 0, "delta": {"tool_calls": calls}}]})
    assert assembler.message()["tool_calls"] == [
        {"id": "call_1", "type": "function", "function": {"name": "a", "arguments": "{}"}},
        {"id": "call_2", "type": "function", "function": {"name": "b", "arguments": "[]"}},
    ]

    assembler = StreamAssembler()
    for calls in [
        [{"index": 0, "id": "call_x", "type": "function", "function": {"name": "x", "arguments": "1"}}],
        [{"index": 0, "id": "call_y", "type": "function", "function": {"name": "y", "arguments": "2"}}],
        [{"index": 0, "function": {"arguments": "3"}}],
    ]:
        assembler.feed({"choices": [{"index": 0, "delta": {"tool_calls": calls}}]})
    assert assembler.message()["tool_calls"] == [
        {"id": "call_x", "type": "function", "function": {"name": "x", "arguments": "1"}},
        {"id": "call_y", "type": "function", "function": {"name": "y", "arguments": "23"}},
    ]


def test_assemble_only_choice_zero() -> None:
    assembler = StreamAssembler()
    assembler.feed(
        {
            "choices": [
                {"index": 1, "delta": {"role": "assistant", "content": "other"}, "finish_reason": None},
                {"index": 0, "delta": {"role": "assistant", "content": "mine"}, "finish_reason": None},
            ]
        }
    )
    assembler.feed({"choices": [{"index": 1, "delta": {}, "finish_reason": "stop"}]})
    assert assembler.message() == {"role": "assistant", "content": "mine"}
    assert not assembler.finished


def test_assemble_message_is_a_copy() -> None:
    assembler = assemble(TOOL_EVENTS)
    message = assembler.message()
    message["tool_calls"][0]["function"]["arguments"] = "changed"
    message["content"] = "changed"
    assert assembler.message() == {"role": "assistant", "content": None, "tool_calls": TOOL_CALLS}


def test_assemble_error_event() -> None:
    error = {
        "message": "The server had an error while processing your request. Sorry about that!",
        "type": "server_error",
        "param": None,
        "code": None,
    }
    stream = b"".join(TEXT_EVENTS[:3]) + b"data: " + json.dumps({"error": error}).encode() + b"\n\n"
    events, tail = split_all(cut(stream, [5, 300, 301]))
    assert tail == b""
    assembler = assemble(events)
    assert assembler.error == error
    assert not assembler.finished
    assert assembler.message() == {"role": "assistant", "content": "Hello! Bonjour \u00e0 vous \U0001f44b"}

    named = parse_event(b"event: error\ndata: " + json.dumps({"error": error}).encode() + b"\n\n")
    assert named is not None and named.event == "error"
    assembler = StreamAssembler()
    assembler.feed(named.json())
    assert assembler.error == error


def test_assemble_stream_cut_before_finish_reason() -> None:
    stream = b"".join(TEXT_EVENTS)
    stop = len(b"".join(TEXT_EVENTS[:4])) + 25  # inside the fifth event
    rng = random.Random(7)
    events, tail = split_all(cut(stream[:stop], rng.sample(range(stop), 40)))
    assert events == TEXT_EVENTS[:4]
    assert tail == TEXT_EVENTS[4][:25]
    assert not tail.endswith(b"\n")  # incomplete: relayed as is, never parsed
    assembler = assemble(events)
    assert not assembler.finished
    assert assembler.finish_reason is None
    assert assembler.usage is None
    assert assembler.message() == {"role": "assistant", "content": "Hello! Bonjour \u00e0 vous \U0001f44b How can I"}


# --- is_usage_only / message_from_completion ---------------------------------------------------------------------


def test_is_usage_only() -> None:
    assert is_usage_only(json.loads(USAGE_CHUNK))
    assert not is_usage_only(json.loads(TEXT_CHUNKS[1]))  # "usage": null on every other chunk
    assert not is_usage_only(json.loads(TEXT_CHUNKS[5]))  # the finish chunk
    assert not is_usage_only(json.loads(chunk('{"index":0,"delta":{"content":"x"},"finish_reason":null}', USAGE)))
    assert not is_usage_only({"choices": [], "usage": None})
    assert not is_usage_only({"error": {"message": "boom"}})
    assert is_usage_only({"id": "cmpl-1", "choices": None, "usage": json.loads(USAGE)})  # vLLM
    assert is_usage_only({"id": "cmpl-1", "usage": json.loads(USAGE)})


def test_usage_only_chunk_can_be_hidden_without_losing_usage() -> None:
    assembler = StreamAssembler()
    relayed: list[bytes] = []
    for raw in TEXT_EVENTS:
        event = parse_event(raw)
        if event is not None and not event.is_done:
            parsed = event.json()
            assembler.feed(parsed)
            if is_usage_only(parsed):
                continue
        relayed.append(raw)
    assert relayed == TEXT_EVENTS[:6] + TEXT_EVENTS[7:]
    assert assembler.usage == json.loads(USAGE)


def test_message_from_completion() -> None:
    body = {
        "id": "chatcmpl-B9MBs8CjcvOU2jLn4n570S5qMJKcT",
        "object": "chat.completion",
        "created": 1741569952,
        "model": "gpt-4o-mini-2024-07-18",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "Hello!", "refusal": None, "annotations": []},
                "logprobs": None,
                "finish_reason": "stop",
            }
        ],
        "usage": json.loads(USAGE),
        "service_tier": "default",
        "system_fingerprint": "fp_06737a9306",
    }
    message, usage = message_from_completion(body)
    assert message is body["choices"][0]["message"]
    assert message == {"role": "assistant", "content": "Hello!", "refusal": None, "annotations": []}
    assert usage == json.loads(USAGE)
    assert message_from_completion({"choices": []}) == (None, None)
    assert message_from_completion({"error": {"message": "bad"}}) == (None, None)
    assert message_from_completion({"choices": [{"index": 0, "message": {"role": "assistant", "content": "x"}}]}) == (
        {"role": "assistant", "content": "x"},
        None,
    )
