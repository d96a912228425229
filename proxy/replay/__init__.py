"""``ctxproxy replay``: a recorded session run through the context engine offline, and what its last view kept."""
