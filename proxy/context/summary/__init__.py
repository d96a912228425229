"""The model's summary: the request, the answer merged into the previous one, chunking, the model-free tier, what
the calls cost."""
