"""The exact texts the clients use for their own compaction, and where each was read.

Claude Code's were read from the 2.1.332 release itself (the JavaScript bundled
in ``@anthropic-ai/claude-code-linux-x64``); Codex's from openai/codex,
``codex-rs/core/templates/compact/prompt.md`` and ``summary_prefix.md`` and the
Rust that uses them (``codex-rs/core/src/compact.rs``); Gemini CLI's from the
0.61.0 bundle (``@google/gemini-cli``, its ``compress`` and ``getCompressionPrompt``;
google-gemini/gemini-cli ``packages/core/src/services/chatCompressionService.ts``).
Only the stable heads of the texts are matched: the bodies change between releases.
"""

from __future__ import annotations

import re

# -- Claude Code ------------------------------------------------------------------------------------

#: The first words of every summary request, whatever its variant (full, partial, custom prompt).
CLAUDE_MARKER = "CRITICAL: Respond with TEXT ONLY. Do NOT call any tools."
#: The task sentence of the three built-in variants: the whole conversation (auto-compact and ``/compact``),
#: only the recent part ("summarize from here": the earlier messages stay verbatim) and the part up to a point
#: (newer messages follow the summary).
CLAUDE_TASK = re.compile(
    r"Your task is to create a detailed summary of "
    r"(?P<scope>the conversation so far|the RECENT portion of the conversation|this conversation)"
)
#: The closing reminder every variant ends with (a custom prompt has no task sentence, but has this).
CLAUDE_REMINDER = "\nREMINDER: Do NOT call any tools. Respond with plain text only"
#: What the request asks for: with the analysis scratchpad (the default) or the summary alone.
CLAUDE_WANTS_ANALYSIS = "an <analysis> block followed by a <summary> block"
#: ``/compact <text>`` appends the text after this line, before the reminder.
CLAUDE_INSTRUCTIONS = "\nAdditional Instructions:\n"
#: The first user message after a compaction starts with this (after an optional marker line), then
#: ``Summary:`` and the summary.
CLAUDE_CONTINUATION = (
    "This session is being continued from a previous conversation that ran out of context. "
    "The summary below covers the earlier portion of the conversation."
)
CLAUDE_SUMMARY_LABEL = "Summary:\n"
#: Notes Claude Code appends after the summary in that message (transcript path, left-out results, the
#: instruction to resume): each starts a line.
CLAUDE_TRAILERS = re.compile(
    r"\n(?:If you need specific details from before compaction"
    r"|Note: part of the earlier conversation was too large"
    r"|Note: \d+ tool results? \("
    r"|The summarized conversation included text marked as coming from a Remote Control session"
    r"|Continue the conversation from where it left off"
    r"|The messages after this summary are the most recent messages from before compaction)"
)

# -- Codex --------------------------------------------------------------------------------------------

#: The first words of ``templates/compact/prompt.md``, the default ``compact_prompt`` of local compaction.
CODEX_PROMPT = "You are performing a CONTEXT CHECKPOINT COMPACTION"
#: The first sentence of ``templates/compact/summary_prefix.md``. Later requests carry the summary as a user
#: message ``f"{SUMMARY_PREFIX}\n{summary}"``; the rest of the prefix differs between releases (one has a double
#: space), so only this sentence is matched and the summary is what follows the first newline.
CODEX_SUMMARY_PREFIX = (
    "Another language model started to solve this problem and produced a summary of its thinking process."
)
#: The last input item of a remote compaction turn (``compact_remote_v2.rs``).
CODEX_TRIGGER = "compaction_trigger"
#: Item types that carry a compaction back: ``compaction``, and ``compaction_summary``, its serde alias.
CODEX_COMPACTION_TYPES = frozenset({"compaction", "compaction_summary"})
#: Where Codex says what a request is for: ``client_metadata`` in the body (and the header of the same name),
#: a JSON object whose ``request_kind`` is ``"compaction"`` on compaction requests (``responses_metadata.rs``).
CODEX_TURN_METADATA = "x-codex-turn-metadata"

# -- Gemini CLI ---------------------------------------------------------------------------------------

#: How the ``systemInstruction`` of both of its compression calls starts.
GEMINI_SYSTEM = ("You are a specialized system component responsible for distilling chat history into a "
                 "structured XML <state_snapshot>.")
#: The end of the first call's last user turn (after "Generate a new <state_snapshot> …" or "A previous
#: <state_snapshot> exists …").
GEMINI_ASK = "Then, generate the updated <state_snapshot>."
#: How the second call's last user turn starts; the model turn before it holds the first call's answer.
GEMINI_VERIFY = "Critically evaluate the <state_snapshot> you just generated."
#: The sections its prompt asks for, in order.
GEMINI_SECTIONS = ("overall_goal", "active_constraints", "key_knowledge", "artifact_trail", "file_system_state",
                   "recent_actions", "task_state")
