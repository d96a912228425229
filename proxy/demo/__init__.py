"""``ctxproxy demo``: a long agent run through the real proxy, with no key and no network.

A scripted model (``model``: an aiohttp app on a loopback port speaking the
Chat Completions API) and a scripted agent (``agent``: a client that runs the
model's tool calls against a workspace held in memory, ``script``) meet through
the proxy ``serve`` runs (``proxy.app.create_app``) in a small window, so that
every tier of compaction happens within seconds: masked tool outputs, model
summaries, and the model-free tier where the scripted model fails a summary call
on purpose. ``session`` runs it and reports what happened from the store, then
serves the inspector on the session behind a one-time sign-in link.
"""
