"""What a client answers for a tool call it refused: the exact wordings, in one place, and which of them prove
that nothing ran.

A call the user or the client's policy refused changed nothing, and the working set
(``proxy.context.keep.workingset``) keeps the files in hand as they were (a refused
``python3 -c "open(…, 'w')…"`` dropped them all); the artifact trail says the call was
refused and why (``reason``: ``refused: exec command rejected: …``, where it listed the
command as run), and the literals keep that reason as an error of the call, never as a
run that resolves an earlier error of it. But a client also answers "rejected"
for calls that had started, so only a wording that its client writes before the call
runs, and nowhere else, counts as not run (``NOT_RUN``). The others (``DECLINED``) say
the call did not succeed, and what it may have done is not known: the working set,
the trail and the literals treat them as failed calls (a Codex patch the user declined is not applied to the
text in hand, a heredoc the user declined does not set the file). A wording not listed
here keeps its call read as it was. Where each comes from:

Not run (``NOT_RUN``):

- Claude Code ``CANCEL_MESSAGE`` (``src/utils/messages.ts``; ``HWA`` in the 2.0.57
  bundle): answered by ``runToolUse`` for a call whose turn was already aborted, before
  its permission check and before it runs (``src/query.ts``).
- Claude Code ``REJECT_MESSAGE_WITH_REASON_PREFIX`` (``pPA`` in the 2.0.57 bundle):
  the user said no at the permission prompt and typed what to do instead; only the
  prompt writes it.
- Claude Code's permission rules, decided before a call runs: a deny rule ("Permission
  to use Bash with command … has been denied."), don't-ask mode ("… has been denied
  because Claude Code is running in don't ask mode."), the auto-mode classifier
  ("Permission for this action has been denied. Reason: …") and a headless run
  without the permission ("Claude requested permissions to use Bash, but you haven't
  granted it yet.").
- Codex's safety check before it spawns the command (``codex-rs/core/src/codex.rs``,
  ``SafetyCheck::Reject``): "exec command rejected: REASON".
- Gemini CLI: "[Operation Cancelled] Reason: User denied execution." (the user chose
  to cancel at the confirmation, ``packages/core/src/scheduler/scheduler.ts``, "Skip
  execution"), "… Reason: User cancelled operation" (the calls still queued behind
  it), "… Reason: User did not allow tool call" (the same in the older
  ``coreToolScheduler.ts``, from ``awaiting_approval``), and "Tool execution denied by
  policy." (``packages/core/src/scheduler/policy.ts``, before the confirmation).

Declined, perhaps after it started (``DECLINED``):

- Claude Code ``REJECT_MESSAGE`` without a reason: the permission prompt writes it,
  and so does the tool executor for a call the user interrupted while it ran
  (``user_interrupted``).
- Codex "exec command rejected by user" and "patch rejected by user": the user
  declined the first approval, or the retry outside the sandbox after the command had
  run in it and been denied (``codex-rs/core/src/tools/orchestrator.rs``), or a
  network access or a zsh-fork subcommand while the command ran.
- Gemini CLI "[Operation Cancelled] Reason: Operation cancelled by user" (``cancelAll``
  cancels the executing calls too) and "[Operation Cancelled] User cancelled tool
  execution." (``tool-executor.ts``: after the tool ran).
"""

from __future__ import annotations

import re

#: Claude Code's, Codex's and Gemini CLI's answers for a call that never ran, each a result's opening.
NOT_RUN = re.compile(
    "|".join((
        re.escape("The user doesn't want to take this action right now. STOP what you are doing and wait for the "
                  "user to tell you how to proceed."),
        re.escape("The user doesn't want to proceed with this tool use. The tool use was rejected (eg. if it was a "
                  "file edit, the new_string was NOT written to the file). To tell you how to proceed, the user "
                  "said:\n"),
        r"Permission to use [\w.:-]+ (?:with command .* )?has been denied\b",
        re.escape("Permission for this action has been denied. Reason: "),
        r"Claude requested permissions to .*?, but you haven't granted it yet\.",
        re.escape("exec command rejected: "),
        re.escape("[Operation Cancelled] Reason: ")
        + "(?:" + "|".join(map(re.escape, ("User denied execution.", "User cancelled operation",
                                           "User did not allow tool call"))) + r")\Z",
        re.escape("Tool execution denied by policy."),
    )),
    re.DOTALL)
#: Their answers for a call they declined that may have run in part: a failure, not a call that changed nothing.
DECLINED = re.compile(
    "|".join(map(re.escape, (
        "The user doesn't want to proceed with this tool use. The tool use was rejected",
        "exec command rejected by user",
        "patch rejected by user",
        "[Operation Cancelled] Reason: Operation cancelled by user",
        "[Operation Cancelled] User cancelled tool execution.",
    ))))


#: Claude Code's rejection with a reason: the user's words follow it (``NOT_RUN``'s second wording).
WITH_REASON = "To tell you how to proceed, the user said:\n"


def refused(text: str) -> bool:
    """Whether a call's result ``text`` says its client refused it before it ran (``NOT_RUN``)."""
    return NOT_RUN.match(text.lstrip()) is not None


def declined(text: str) -> bool:
    """Whether ``text`` says the client declined the call, or refused it, so it did not succeed."""
    stripped = text.lstrip()
    return DECLINED.match(stripped) is not None or NOT_RUN.match(stripped) is not None


def reason(text: str) -> str:
    """The line of a refusal that says why, verbatim (stripped): the first line of the user's words after Claude
    Code's rejection with a reason (its own opening line is the same for every rejection), else the first line."""
    words = text.partition(WITH_REASON)[2]
    return next((line.strip() for line in (*words.splitlines(), *text.splitlines()) if line.strip()), "")
