"""HTTP handlers: they parse, call the engine and the store, and render. Nothing else."""
