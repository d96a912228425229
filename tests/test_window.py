from __future__ import annotations

import subprocess
import sys

from proxy.context.view.window import bundled_model_map, context_window_for, litellm_dir

MAP = {
    "gpt-4o": {"max_input_tokens": 128000, "max_output_tokens": 16384},
    "legacy": {"max_tokens": 4097},
    "openai/special": {"max_input_tokens": 1000},
    "special": {"max_input_tokens": 2000},
    "sample_spec": {"max_input_tokens": "max input tokens, if the provider specifies it"},
    "flagged": {"max_input_tokens": True, "max_tokens": 0},
    "not-a-dict": 5,
}


def test_exact_name() -> None:
    assert context_window_for("gpt-4o", MAP) == 128000


def test_max_tokens_is_the_fallback_field() -> None:
    assert context_window_for("legacy", MAP) == 4097


def test_provider_prefix_is_stripped() -> None:
    assert context_window_for("openai/gpt-4o", MAP) == 128000


def test_every_leading_segment_is_stripped_in_turn() -> None:
    assert context_window_for("openrouter/openai/gpt-4o", MAP) == 128000


def test_exact_name_wins_over_the_stripped_one() -> None:
    assert context_window_for("openai/special", MAP) == 1000


def test_unknown_model_is_none() -> None:
    assert context_window_for("no-such-model", MAP) is None
    assert context_window_for("", MAP) is None
    assert context_window_for("vendor/", MAP) is None


def test_values_that_are_not_positive_ints_are_ignored() -> None:
    assert context_window_for("sample_spec", MAP) is None
    assert context_window_for("flagged", MAP) is None
    assert context_window_for("not-a-dict", MAP) is None


def test_bundled_map_is_read_once() -> None:
    assert bundled_model_map() is bundled_model_map()
    assert litellm_dir() is not None


def test_bundled_map_knows_common_models() -> None:
    assert context_window_for("gpt-4o") == 128000
    assert context_window_for("openai/gpt-4o") == 128000
    assert context_window_for("no-such-model-anywhere") is None


def test_litellm_is_never_imported() -> None:
    code = (
        "import sys\n"
        "from proxy.context.view.window import context_window_for\n"
        "assert context_window_for('gpt-4o') == 128000\n"
        "print('litellm' in sys.modules)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout == "False\n"


async def test_the_model_map_is_read_at_startup_not_by_the_first_request(make_proxy) -> None:
    """Parsing litellm's map takes tens of milliseconds: the proxy's startup pays it, off the loop."""
    bundled_model_map.cache_clear()
    await make_proxy()
    assert bundled_model_map.cache_info().currsize == 1
    assert bundled_model_map()  # the real map, found without importing litellm
