"""The ``ctxproxy`` command: ``serve`` and, for people, ``sessions list|log|view``."""

from __future__ import annotations

import logging.config
from typing import Any

import click
from aiohttp import web

from proxy.logs import default_log_config
from proxy.settings import Settings, default_store_url

logger = logging.getLogger(__name__)


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(package_name="ctxproxy")
def main() -> None:
    """ctxproxy: an OpenAI-compatible proxy that keeps long agent runs inside the model's context window.

    Point your agent's OPENAI_BASE_URL at http://HOST:PORT/v1 (or /s/SESSION/v1).
    """


def _store_option(f: Any) -> Any:
    return click.option("--store", envvar="CTXPROXY_STORE", default=None, show_envvar=True,
                        help=f"redis://…, rediss://… (add ?cluster=1 for Redis Cluster) or sqlite:///path "
                             f"[default: {default_store_url()}]")(f)


@main.command()
@click.option("--host", envvar="CTXPROXY_HOST", default=None, show_envvar=True,
              help="Bind address [default: 127.0.0.1]")
@click.option("--port", envvar="CTXPROXY_PORT", type=int, default=None, show_envvar=True,
              help="Bind port [default: 8787]")
@click.option("--upstream", envvar="CTXPROXY_UPSTREAM", default=None, show_envvar=True,
              help="Base URL of the OpenAI-compatible upstream, path prefix included "
                   "[default: https://api.openai.com/v1]")
@_store_option
@click.option("--context-window", envvar="CTXPROXY_CONTEXT_WINDOW", type=int, default=None, show_envvar=True,
              help="Tokens [default: the model's input window from the bundled model map, else 128000]")
@click.option("--compression-threshold", envvar="CTXPROXY_COMPRESSION_THRESHOLD", type=float, default=None,
              show_envvar=True, help="Compact when the estimate exceeds window x threshold [default: 0.8]")
@click.option("--min-retain-rounds", envvar="CTXPROXY_MIN_RETAIN_ROUNDS", type=int, default=None, show_envvar=True,
              help="Recent rounds kept verbatim [default: 10]")
@click.option("--summary-model", envvar="CTXPROXY_SUMMARY_MODEL", default=None, show_envvar=True,
              help="Model that writes summaries [default: the request's model]")
@click.option("--summary-timeout", envvar="CTXPROXY_SUMMARY_TIMEOUT", type=float, default=None, show_envvar=True,
              help="Seconds before a summary call is abandoned [default: 120]")
@click.option("--admin-token", envvar="CTXPROXY_ADMIN_TOKEN", default=None, show_envvar=True,
              help="Bearer token for /admin/* [default: unset, admin API off]")
@click.option("--upstream-key", envvar="CTXPROXY_UPSTREAM_KEY", default=None, show_envvar=True,
              help="Key the proxy uses upstream instead of the client's [default: unset]")
@click.option("--client-keys", envvar="CTXPROXY_CLIENT_KEYS", default=None, show_envvar=True,
              help="Comma-separated keys a client must present, 401 otherwise [default: unset, any key]")
@click.option("--max-body-bytes", envvar="CTXPROXY_MAX_BODY_BYTES", type=int, default=None, show_envvar=True,
              help="Largest request body accepted; larger gets 413 [default: 33554432]")
@click.option("--upstream-timeout", envvar="CTXPROXY_UPSTREAM_TIMEOUT", type=float, default=None, show_envvar=True,
              help="Seconds of upstream silence before a 504 [default: 600]")
@click.option("--reactive-retries", envvar="CTXPROXY_REACTIVE_RETRIES", type=int, default=None, show_envvar=True,
              help="Compact-harder-and-retry attempts after a prompt-too-long answer [default: 2]")
@click.option("--estimator", envvar="CTXPROXY_ESTIMATOR", type=click.Choice(["tokenizer", "chars", "max"]),
              default=None, show_envvar=True,
              help="Token estimate: tiktoken count, the seed's characters / 3, or the larger [default: tokenizer]")
@click.option("--summary-placement", envvar="CTXPROXY_SUMMARY_PLACEMENT", type=click.Choice(["user", "system"]),
              default=None, show_envvar=True,
              help="Put the summary in a user message or append it to the system message [default: user]")
@click.option("--compaction-cooldown", envvar="CTXPROXY_COMPACTION_COOLDOWN", type=float, default=None,
              show_envvar=True, help="Seconds proactive compaction pauses after 3 failures in a row [default: 300]")
@click.option("--log-format", envvar="CTXPROXY_LOG_FORMAT", type=click.Choice(["text", "json"]), default=None,
              show_envvar=True, help="Log line format [default: text]")
@click.option("--log-level", envvar="CTXPROXY_LOG_LEVEL", default=None, show_envvar=True,
              help="Log level [default: INFO]")
def serve(**options: Any) -> None:
    """Run the proxy."""
    try:
        settings = Settings.from_env({}, **options)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None
    logging.config.dictConfig(default_log_config(settings.log_level, settings.log_format))
    from proxy.app import create_app

    logger.info("ctxproxy listening on http://%s:%d, upstream %s", settings.host, settings.port, settings.upstream)
    web.run_app(create_app(settings), host=settings.host, port=settings.port, print=None,
                handler_cancellation=True, access_log=None)
