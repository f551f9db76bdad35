"""Every GUI test ends with the threads it started stopped: a window, an adapter or a worker left
running fails the test that left it, not a later one that trips over it."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

_JOIN_S = 10.0  # a bound for threads already told to stop (a shutdown queued on the thread), not a wait
# The process's shared pool for short tasks (``app.gui.tasks.run_in_background``) lives as long as
# the app by design: it is shut down at exit, not by the window.
_PROCESS_POOLS = ("glassbox-bg",)


@pytest.fixture(autouse=True)
def no_thread_left(request: pytest.FixtureRequest) -> Iterator[None]:
    """Fails the test when a thread it started is still alive after its teardown (pytest-qt closes
    its widgets first: this fixture is set up before ``qtbot`` and torn down after it)."""
    before = set(threading.enumerate())
    yield
    left = [
        t
        for t in threading.enumerate()
        if t not in before and t.is_alive() and not t.daemon and not t.name.startswith(_PROCESS_POOLS)
    ]
    for thread in left:
        thread.join(_JOIN_S)
    alive = [t.name for t in left if t.is_alive()]
    if alive:
        pytest.fail(f"{request.node.name} left threads running: {', '.join(sorted(alive))}", pytrace=False)
