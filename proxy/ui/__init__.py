"""The session inspector behind ``GET /ui``: server-rendered HTML, one stylesheet, one small script.

Templates and static files ship inside this package (package data), so the
inspector works offline with nothing to build and nothing fetched from a CDN.
"""

from __future__ import annotations

import functools
from importlib import resources
from string import Template

#: The only files ``/ui/static/`` serves, and their types.
STATIC_TYPES = {"ui.css": "text/css", "ui.js": "text/javascript"}


@functools.cache
def template(name: str) -> Template:
    """A ``string.Template`` from ``templates/``: every value substituted into one must be escaped already."""
    return Template(resources.files(__package__).joinpath("templates", name).read_text("utf-8"))


@functools.cache
def static_file(name: str) -> bytes:
    if name not in STATIC_TYPES:
        raise KeyError(name)
    return resources.files(__package__).joinpath("static", name).read_bytes()
