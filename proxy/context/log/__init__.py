"""The fact log as the engine reads it: the history, its lineages, pending replies, undo, the session lock."""
