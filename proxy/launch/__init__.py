"""``ctxproxy run AGENT``: an agent started through an embedded (or running) proxy."""
