"""Image build step: cut the installed litellm down to the data files ctxproxy reads, then check them.

ctxproxy depends on litellm for files only, never imports it (see
``proxy/context/view/window.py`` and ``proxy/context/view/tokens.py``): the model map
``model_prices_and_context_window_backup.json`` and the tiktoken encodings in
``litellm_core_utils/tokenizers/``. The Dockerfile installs litellm without its
dependency tree; this script then removes the rest of the package (some 200 MB
of code) and replaces its ``__init__`` with a stub, so nothing half-deleted can
be imported by accident.

It exits non-zero when the proxy would not find its files, so a litellm
release that moves them fails the build instead of quietly leaving the image
with a 128k default window and a characters / 3 estimate.

Run it with the interpreter that has ``proxy`` and litellm installed:
``python slim_litellm.py`` (or ``--check`` to verify without removing anything).
"""

from __future__ import annotations

import contextlib
import shutil
import sys
from pathlib import Path

STUB = '"""litellm\'s data files only (model map, tokenizers), kept by the ctxproxy image; its code was removed."""\n'


def keep_paths(root: Path) -> list[Path]:
    """What the proxy reads below litellm's package directory ``root``."""
    from proxy.context.view.tokens import TOKENIZERS_SUBDIR
    from proxy.context.view.window import MODEL_MAP_FILE

    return [root / "__init__.py", root / MODEL_MAP_FILE, root.joinpath(*TOKENIZERS_SUBDIR)]


def prune(root: Path, keep: list[Path]) -> int:
    """Delete everything under ``root`` that is neither in ``keep`` nor on the way to it; return bytes freed."""
    freed = 0
    for path in sorted(root.iterdir()):
        if any(path == k or path in k.parents for k in keep):
            if path.is_dir() and path not in keep:
                freed += prune(path, keep)
            continue
        if path.is_dir() and not path.is_symlink():
            freed += sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
            shutil.rmtree(path)
        else:
            freed += path.lstat().st_size
            path.unlink()
    return freed


def prune_outside(root: Path) -> int:
    """Delete what the litellm distribution installed beside its package (``litellm_cli``, console scripts)."""
    from importlib.metadata import distribution

    freed = 0
    emptied: set[Path] = set()
    for file in distribution("litellm").files or []:
        path = Path(str(file.locate())).resolve()
        if root.resolve() in path.parents or path.parent.name.endswith(".dist-info") or not path.is_file():
            continue
        freed += path.stat().st_size
        path.unlink()
        emptied.update(path.parents[:2])
    for directory in sorted(emptied, key=lambda d: len(d.parts), reverse=True):
        with contextlib.suppress(OSError):  # rmdir removes only empty directories
            directory.rmdir()
    return freed


def check() -> list[str]:
    """Problems that would make the proxy fall back to its defaults; empty when all is in place."""
    from proxy.context.view.tokens import TOKENIZERS_SUBDIR, bundled_encoding, bundled_encoding_name
    from proxy.context.view.window import bundled_model_map, context_window_for, litellm_dir

    for cached in (litellm_dir, bundled_model_map, bundled_encoding):  # look again, not at a cached answer
        cached.cache_clear()
    root = litellm_dir()
    if root is None:
        return ["litellm is not installed"]
    problems = []
    if not bundled_model_map() or context_window_for("gpt-4o") is None:
        problems.append(f"no usable model map in {root}")
    tokenizers = root.joinpath(*TOKENIZERS_SUBDIR)
    if bundled_encoding_name(tokenizers) is None:
        problems.append(f"no bundled tiktoken encoding in {tokenizers}")
    else:
        encoding = bundled_encoding()
        if encoding is None or not encoding.encode_ordinary("hello world"):
            problems.append(f"the tiktoken encoding in {tokenizers} does not load")
    return problems


def main(argv: list[str]) -> int:
    from proxy.context.view.window import litellm_dir

    problems = check()
    root = litellm_dir()
    if not problems and root is not None and "--check" not in argv:
        freed = prune(root, keep_paths(root)) + prune_outside(root)
        (root / "__init__.py").write_text(STUB)
        print(f"slim_litellm: removed {freed / 1e6:.0f} MB from {root}")
        problems = check()
    for problem in problems:
        print(f"slim_litellm: {problem}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
