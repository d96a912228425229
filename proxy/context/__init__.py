"""The context engine, the seed's parts: free of HTTP, of wire formats beyond the dialects' item model, and of any
store driver.

- ``log/``: the fact log as the engine reads it (history, lineages, pending replies, undo, the session lock);
- ``view/``: what is sent and its tiers (budget and token counts, projection, masking, clipping, which checkpoint
  applies);
- ``summary/``: the model's summary (its request, the answer merged into the previous one, chunking, the
  model-free tier, what the calls cost);
- ``keep/``: what the proxy writes into a summary item itself, exactly from the log (the artifact trail, the files in
  hand, the literals, the pins, the user's words);
- ``engine.py``, ``compactor.py``, ``checkpoint.py``, ``background.py``, ``items.py``: the orchestration, the
  checkpoint it leaves in the log, and the item model every part reads.
"""
