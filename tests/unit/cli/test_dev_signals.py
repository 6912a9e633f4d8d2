"""``evsched dev`` stops its children on SIGTERM and SIGHUP as on Ctrl-C (issue 32, item 5)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from evsched.cli.dev import DevStack

SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


@pytest.fixture(autouse=True)
def restored_handlers() -> Iterator[None]:
    saved = {signum: signal.getsignal(signum) for signum in SIGNALS}
    yield
    for signum, handler in saved.items():
        signal.signal(signum, handler)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP], ids=["TERM", "HUP"])
def test_a_signal_stops_every_child(tmp_path: Path, signum: signal.Signals) -> None:
    stack = DevStack(app="examples.app:app", data_dir=tmp_path)
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    stack.children.append(child)
    stack._run = stack._wait  # type: ignore[method-assign]  # the children, without a broker
    threading.Timer(0.2, os.kill, (os.getpid(), signum)).start()
    try:
        stack.run()
    finally:
        if child.poll() is None:
            child.kill()
    assert child.wait(timeout=10) == -signal.SIGTERM  # stopped by dev, not by the finally
