"""``microspec`` with every step of the server's worker at least SECONDS long: for tests whose premise is a
generation that outlasts a deadline (a timeout, a race with a disconnect) on any machine, however fast.

    python tests/slow_steps.py SECONDS serve --model ...

The production code knows nothing of it: the worker's step (``microspec.decoding.loop.step_many``) is wrapped here
before the command runs (:func:`slow_steps`; in process, tests wrap it with ``monkeypatch`` the same way)."""

from __future__ import annotations

import sys
import time


def slow_steps(seconds: float, setattr_=setattr):
    """Wrap ``step_many`` so that each call lasts ``seconds`` longer (``setattr_``: ``monkeypatch.setattr`` in
    process, so that the test undoes it)."""
    from microspec.decoding import loop

    real = loop.step_many

    def step_many(*args, **kwargs):
        out = real(*args, **kwargs)
        time.sleep(seconds)
        return out

    setattr_(loop, "step_many", step_many)


if __name__ == "__main__":
    slow_steps(float(sys.argv[1]))
    from microspec.cli import main

    sys.exit(main(sys.argv[2:]))
