"""The context engine: fact-log sync, budget, compaction and projection. Free of HTTP and of any store driver."""
