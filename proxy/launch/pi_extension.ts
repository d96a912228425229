// Loaded by `ctxproxy run pi` (pi -e): points pi's openai and anthropic providers at the proxy and, unless the run
// keeps pi's own compaction, cancels pi's automatic compactions (the proxy compacts). Told where by the variables
// the launcher sets; pi's own files (~/.pi/agent) are neither read nor written here.
export default function ctxproxy(pi: any) {
  const openai = process.env.CTXPROXY_PI_OPENAI_BASE_URL;
  const anthropic = process.env.CTXPROXY_PI_ANTHROPIC_BASE_URL;
  if (openai) pi.registerProvider("openai", { baseUrl: openai });
  if (anthropic) pi.registerProvider("anthropic", { baseUrl: anthropic });
  if (process.env.CTXPROXY_PI_NO_AUTO_COMPACTION === "1") {
    pi.on("session_before_compact", (event: any) => (event?.reason === "manual" ? undefined : { cancel: true }));
  }
}
