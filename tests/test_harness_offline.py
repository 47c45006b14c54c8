"""`lm-eval` where the Hugging Face Hub cannot be reached: one note, the harness switched to offline mode (so a
cached dataset still loads and a missing one fails at once instead of after the Hub client's retries), and a user's
own offline setting respected. No network is touched: the probe is replaced."""

from __future__ import annotations

import sys
from types import SimpleNamespace

import pytest

from compressive_transformer.harness import offline


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for variable in offline.OFFLINE_VARIABLES:
        monkeypatch.delenv(variable, raising=False)  # restored after the test, whatever the code sets
    return monkeypatch


def test_an_unreachable_hub_switches_the_harness_offline(clean_env: pytest.MonkeyPatch) -> None:
    constants = SimpleNamespace(HF_HUB_OFFLINE=False)  # a Hub client imported before the switch
    clean_env.setitem(sys.modules, "huggingface_hub.constants", constants)
    clean_env.setattr(offline, "hub_reachable", lambda timeout=3.0: False)
    note = offline.offline_unless_reachable()
    assert note is not None and "cannot be reached" in note and "offline" in note
    assert all(offline.os.environ[v] == "1" for v in offline.OFFLINE_VARIABLES) and constants.HF_HUB_OFFLINE is True


def test_a_reachable_hub_or_a_chosen_offline_mode_changes_nothing(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setattr(offline, "hub_reachable", lambda timeout=3.0: True)
    assert offline.offline_unless_reachable() is None
    assert not any(v in offline.os.environ for v in offline.OFFLINE_VARIABLES)

    def no_probe(timeout: float = 3.0) -> bool:
        raise AssertionError("offline already: nothing to probe")

    clean_env.setattr(offline, "hub_reachable", no_probe)
    clean_env.setenv("HF_HUB_OFFLINE", "1")
    assert offline.offline_unless_reachable() is None


def test_the_offline_error_is_one_line() -> None:
    error = ConnectionError("Couldn't reach 'EleutherAI/wikitext_document_level' on the Hub\n(OfflineModeIsEnabled)")
    line = offline.offline_error(error)
    assert "\n" not in line and "wikitext_document_level" in line and "--include_path" in line
