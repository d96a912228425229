"""``ctxproxy demo``: the command (``session`` does the work)."""

from __future__ import annotations

import asyncio
import logging.config

import click

from proxy.logs import default_log_config


@click.command()
@click.option("--store", default=None, metavar="URL",
              help="Store to log the demo session in [default: demo.db beside the default store, never your "
                   "own; CTXPROXY_STORE is not read]")
@click.option("--no-serve", is_flag=True, help="Print the report and exit, without serving the inspector.")
@click.option("--json", "as_json", is_flag=True,
              help="Also print the report's figures as one JSON line (after the text).")
def demo(store: str | None, no_serve: bool, as_json: bool) -> None:
    """See it work: a scripted agent and model through the proxy, no key and no network.

    A 37-request coding session in a 6,000-token window: old tool outputs are masked, older turns summarised by
    the scripted model, and one summary call fails so the model-free tier stands in. Prints what happened, then
    serves the inspector on the session (a one-time sign-in link) until Ctrl-C.
    """
    from proxy.demo.session import demo_store_url, run_demo

    logging.config.dictConfig(default_log_config("ERROR", "text"))
    try:
        asyncio.run(run_demo(store or demo_store_url(), not no_serve, click.echo, as_json))
    except KeyboardInterrupt:  # Ctrl-C before the inspector was up
        raise SystemExit(130) from None
