// Loaded by `ctxproxy run pi` (pi -e): points pi's openai (Responses API) and anthropic (Messages API) providers at
// the proxy and, unless the run keeps pi's own compaction, cancels pi's automatic compactions (the proxy compacts).
// Told where by the variables the launcher sets; pi's own files (~/.pi/agent) are neither read nor written here.
export default function ctxproxy(pi: any) {
  const openai = process.env.CTXPROXY_PI_OPENAI_BASE_URL;
  const anthropic = process.env.CTXPROXY_PI_ANTHROPIC_BASE_URL;
  if (openai) pi.registerProvider("openai", { baseUrl: openai });
  if (anthropic) pi.registerProvider("anthropic", { baseUrl: anthropic });
  if (process.env.CTXPROXY_PI_NO_AUTO_COMPACTION !== "1") return;
  // pi (0.73) does not tell an extension why it compacts. It compacts by itself at two moments only: while its run
  // is ending (the agent_end listeners, before the agent goes idle: its threshold and overflow checks) and while a
  // prompt is being submitted (the same check, between the input event and the run's start). A compaction at any
  // other moment was asked for (/compact, the RPC compact command) and goes ahead.
  let submitting = false;
  pi.on("input", () => {
    submitting = true;
  });
  pi.on("agent_start", () => {
    submitting = false;
  });
  pi.on("session_before_compact", (_event: unknown, ctx: { isIdle(): boolean }) =>
    submitting || !ctx.isIdle() ? { cancel: true } : undefined);
}
