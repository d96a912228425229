"""ctxproxy: an OpenAI-compatible reverse proxy that keeps long agent runs inside the model's window."""

__version__ = "0.1.0"
