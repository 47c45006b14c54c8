"""The harness without a network: where the Hugging Face Hub cannot be reached, say so once and run the harness
offline, so that a task whose dataset is cached still runs and one whose dataset is not fails at once (rather than
after the Hub client's retries, some 40 s per file). Needs no extra: it runs before the harness is imported."""

from __future__ import annotations

import os
import socket
import sys
import threading
from urllib.parse import urlparse

OFFLINE_VARIABLES = ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")
# the same switches in modules that read them at import, should the harness already be imported (a Python session)
OFFLINE_CONSTANTS = (
    ("huggingface_hub.constants", "HF_HUB_OFFLINE"),
    ("datasets.config", "HF_HUB_OFFLINE"),
    ("datasets.config", "HF_DATASETS_OFFLINE"),
)


def hub_address() -> tuple[str, int]:
    """Host and port of the Hub (``HF_ENDPOINT`` where set)."""
    url = urlparse(os.environ.get("HF_ENDPOINT") or "https://huggingface.co")
    return url.hostname or "huggingface.co", url.port or (80 if url.scheme == "http" else 443)


def hub_reachable(timeout: float = 3.0) -> bool:
    """Whether the Hub accepts a connection within ``timeout`` seconds, its name lookup included."""
    answers: list[bool] = []

    def probe() -> None:
        try:
            socket.create_connection(hub_address(), timeout=timeout).close()
            answers.append(True)
        except OSError:
            answers.append(False)

    thread = threading.Thread(target=probe, daemon=True)  # a name lookup ignores the socket's timeout
    thread.start()
    thread.join(timeout)
    return bool(answers and answers[0])


def offline_already() -> bool:
    return any(os.environ.get(v, "").strip().lower() in ("1", "true", "yes", "on") for v in OFFLINE_VARIABLES)


def go_offline() -> None:
    """Switch the Hub client and ``datasets`` to their offline mode, imported or not."""
    for variable in OFFLINE_VARIABLES:
        os.environ[variable] = "1"
    for module, name in OFFLINE_CONSTANTS:
        loaded = sys.modules.get(module)
        if loaded is not None and hasattr(loaded, name):
            setattr(loaded, name, True)


def offline_unless_reachable() -> str | None:
    """Go offline when the Hub cannot be reached; the note saying so, or None (online, or offline already)."""
    if offline_already() or hub_reachable():
        return None
    go_offline()
    host, _ = hub_address()
    return f"note: {host} cannot be reached; the harness runs offline, from the datasets in the local cache"


def offline_error(error: BaseException) -> str:
    """One line for a harness run that failed offline for want of a dataset (or any file) from the Hub."""
    detail = " ".join(str(error).split()) or type(error).__name__
    return (
        f"lm-eval: {detail}; the Hugging Face Hub cannot be reached and this is not in the local cache: run once "
        "with network access, or evaluate a task over local files (--include_path DIR)"
    )


__all__ = ["go_offline", "hub_reachable", "offline_error", "offline_unless_reachable"]
