"""The room a summary leaves below the trigger (issue 34's hysteresis, ``proxy.context.keep.room``): what the proxy
writes into the summary item gives way, in a set order, so that the next summary is steps away."""

from __future__ import annotations

import itertools
import json
import random
from dataclasses import replace
from typing import Any

from proxy.context.checkpoint import Checkpoint, masking_checkpoint
from proxy.context.compactor import ContextCompactor
from proxy.context.engine import ContextEngine, EngineSettings
from proxy.context.items import leading_system_count
from proxy.context.keep.literals import LITERALS_SHARE, literal_maker
from proxy.context.keep.room import FILES_FLOOR, Caps, caps
from proxy.context.keep.workingset import refreshed, working_set_maker
from proxy.context.log.history import HistoryManager
from proxy.context.summary.summarizer import SummaryGenerator
from proxy.context.view.projection import ProjectionBuilder
from proxy.context.view.worth import DUE_STEPS
from proxy.dialects import CHAT
from proxy.dialects.chat import message_hash
from proxy.store.base import FactLog, SessionKey
from tests.test_compaction_e2e import prose
from tests.test_compactor import COUNT, CREATED_AT, Model, chat, hashes_of
from tests.test_engine import Summariser

WINDOW = 100_000


def test_far_below_where_the_next_summary_starts_nothing_gives_way() -> None:
    assert caps(view=50_000, soft=70_000, growth=1_000, literals=20_000, files=15_000, window=WINDOW) == Caps()
    # A session that does not grow never comes back to the trigger.
    assert caps(view=69_000, soft=70_000, growth=0, literals=20_000, files=15_000, window=WINDOW) == Caps()


def test_the_literals_give_way_first_then_the_older_files_each_down_to_its_floor() -> None:
    steps = (DUE_STEPS - 1) * 1_000
    # 3,000 over: the literals' borrowed room alone gives it.
    assert caps(view=70_000 - steps + 3_000, soft=70_000, growth=1_000, literals=20_000, files=15_000,
                window=WINDOW) == Caps(literals=17_000)
    # 12,000 over: the literals down to their own share, the files give the rest.
    assert caps(view=70_000 - steps + 12_000, soft=70_000, growth=1_000, literals=20_000, files=15_000,
                window=WINDOW) == Caps(literals=int(WINDOW * LITERALS_SHARE), files=13_000)
    # Far over: both stop at their floors, whatever the room.
    assert caps(view=200_000, soft=70_000, growth=1_000, literals=20_000, files=15_000,
                window=WINDOW) == Caps(literals=int(WINDOW * LITERALS_SHARE), files=int(WINDOW * FILES_FLOOR))


def call(n: int, command: str) -> dict[str, Any]:
    arguments = json.dumps({"command": command})
    return {"role": "assistant", "content": None, "tool_calls": [
        {"id": f"c{n}", "type": "function", "function": {"name": "bash", "arguments": arguments}}]}


def heredoc(path: str, lines: int) -> str:
    return f"cat > {path} <<'EOF'\n" + "".join(f"line {n} of {path}\n" for n in range(lines)) + "EOF"


ERROR = "E   ValueError: unexpected token at line 41 of parser.py"


def session() -> list[dict[str, Any]]:
    """An unresolved error, a long heredoc write the files in hand cannot follow, and three files read."""
    messages: list[dict[str, Any]] = [*chat(1)]
    messages += [call(0, "pytest -q"), {"role": "tool", "tool_call_id": "c0", "content": f"{ERROR}\nExit code 1"}]
    messages += [call(1, heredoc("gen/data.txt", 150)), {"role": "tool", "tool_call_id": "c1",
                                                         "content": "Exit code: 0"}]
    # A shell edit the files in hand cannot follow: they drop the file, the heredoc is the literals' to carry.
    messages += [call(2, "sed -i s/line/row/ gen/data.txt"), {"role": "tool", "tool_call_id": "c2", "content": ""}]
    for n, path in enumerate(("src/old.py", "src/mid.py", "src/new.py"), start=3):
        messages += [call(n, f"cat {path}"), {"role": "tool", "tool_call_id": f"c{n}",
                                              "content": f"# {path}\n" + f"value_{n} = {n}\n" * 60}]
    return messages + chat(16)[1:]


def compactor() -> ContextCompactor:
    return ContextCompactor(SummaryGenerator(Model()), COUNT, clock=lambda: CREATED_AT,  # type: ignore[arg-type]
                            projection=ProjectionBuilder(CHAT), min_retain_rounds=4, measure=Measure(),
                            working_set_of=working_set_maker(CHAT, 6_000, len),
                            literals_of=literal_maker(CHAT, 1_000, len, lent=6_000), context_window=10_000)


async def test_a_summary_whose_parts_would_leave_the_view_near_the_soft_threshold_carries_less_in_order() -> None:
    """An unresolved error, a long heredoc write and the files in hand, in a summary item that would leave the view
    within the rule's steps of where the next summary starts: the heredoc goes (from the literals' section), the
    error stays; with less room still, the older files give way and the newest stays."""
    messages = session()
    long = heredoc("gen/data.txt", 150)
    hashes = hashes_of(messages)
    whole = await compactor().compact(messages, hashes, None, budget=100_000, model="m")
    assert whole.checkpoint is not None
    assert long in whole.checkpoint.literals_text and ERROR in whole.checkpoint.literals_text
    assert all(path in whole.checkpoint.files for path in ("src/old.py", "src/mid.py", "src/new.py"))
    growth = 100
    # Where the next summary starts, a little above the view: the long heredoc gives way, the error stays.
    soft = whole.tokens_after + (DUE_STEPS - 1) * growth - 500
    near = await compactor().compact(messages, hashes, None, budget=100_000, model="m", soft=soft)
    assert near.checkpoint is not None and near.tokens_after < whole.tokens_after
    assert long not in near.checkpoint.literals_text and ERROR in near.checkpoint.literals_text
    assert near.checkpoint.files == whole.checkpoint.files
    # Much nearer: the literals at their floor, the older files in hand give way, the newest stays whole.
    tight = await compactor().compact(messages, hashes, None, budget=100_000, model="m", soft=0)
    assert tight.checkpoint is not None and ERROR in tight.checkpoint.literals_text
    assert "value_5 = 5\n" * 60 in tight.checkpoint.files and "src/old.py" not in tight.checkpoint.files


async def test_a_masking_after_a_capped_summary_renders_the_files_in_hand_within_the_cap() -> None:
    """A masking batch renders the files in hand again (``refreshed``): within the cap the summary put on them,
    which a checkpoint in the log keeps, not at their whole budget, which would spend the room the cap left below
    the trigger."""
    messages = session()
    hashes = hashes_of(messages)
    reducer = compactor()
    tight = await reducer.compact(messages, hashes, None, budget=100_000, model="m", soft=0)
    assert tight.checkpoint is not None and tight.checkpoint.files_cap > 0
    assert len(tight.checkpoint.files) <= tight.checkpoint.files_cap < 6_000
    stored = Checkpoint.from_json(tight.checkpoint.to_json())
    assert stored == tight.checkpoint
    batch = masking_checkpoint(stored, len(messages) - 2, hashes, system_end=leading_system_count(CHAT, messages),
                               model="m", created_at=CREATED_AT)
    masked = refreshed(batch, reducer.working_set_of, messages, ())
    assert len(masked.files) <= tight.checkpoint.files_cap and "src/old.py" not in masked.files
    uncapped = refreshed(replace(batch, files_cap=0), reducer.working_set_of, messages, ())
    assert "src/old.py" in uncapped.files, "nothing here for the cap to hold back"


class Measure:
    """The compactor's text measure in characters, as its counter (``COUNT``) counts the view."""

    def text_tokens(self, text: str) -> int:
        return len(text)

    def part_tokens(self, part: Any) -> int:
        return 0


KEY = SessionKey("tenant", "room")


async def test_a_session_with_steady_growth_gets_at_least_due_steps_between_summaries(store: FactLog) -> None:
    """Each step writes a file from a heredoc and edits it with ``sed`` (the files in hand drop it; the heredoc is a
    literal the proxy carries, of any length), ~700 tokens a step in a 16k window: the literals fill the pool
    with what the files in hand lend, and without the rule the second summary landed three steps after the first
    (the rule leaves the view, where it lands, four steps of growth under the soft threshold)."""
    engine = ContextEngine(HistoryManager(store, clock=lambda: 1000.0),
                           EngineSettings(context_window=16_000, min_retain_rounds=2), clock=lambda: 1000.0)
    summariser = Summariser()
    rng = random.Random(5)
    messages: list[dict[str, Any]] = [{"role": "system", "content": "sys"}, {"role": "user", "content": "go"}]
    summaries: list[int] = []
    last_end: int | None = None
    for n in range(70):
        hashes = [message_hash(m) for m in messages]
        state = await engine.history.sync(KEY, messages, hashes)
        view = await engine.prepare(KEY, messages, hashes, state, dialect=CHAT, model="m", tools=None,
                                    max_output=None, complete=summariser)
        if (job := engine.background.running(KEY)) is not None:
            await job  # deterministic: a background summary lands before the next step
        end = view.checkpoint.summary_end if view.checkpoint is not None else None
        if end is not None and end != last_end:
            summaries.append(n)
        last_end = end
        path = f"src/file_{n}.py"
        messages += [call(n, f"{heredoc(path, 60)}\nsed -i s/line/row/ {path}"),
                     {"role": "tool", "tool_call_id": f"c{n}", "content": "Exit code: 0\n" + prose(rng, 60)}]
    gaps = [b - a for a, b in itertools.pairwise(summaries)]
    assert len(summaries) >= 3 and min(gaps) >= DUE_STEPS, summaries
