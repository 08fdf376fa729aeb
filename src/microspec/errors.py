"""User-facing errors.

Anything raised as :class:`MicrospecError` is a problem with the user's input (a model that cannot be found, a
corrupt file, an out-of-range hyper-parameter).  The CLI prints its message as one line on stderr and exits with
status 2; library callers catch it like any other exception.
"""


class MicrospecError(ValueError):
    """Bad input from the user: reported as one clear line, never as a traceback."""


class MachineError(MicrospecError):
    """What the machine refused (a cache folder that cannot be written, a full disk): one clear line naming the path
    and what to do; the command line exits with status 4 for it."""


def check(condition: bool, message: str) -> None:
    """Raise :class:`MicrospecError` with ``message`` unless ``condition`` holds."""
    if not condition:
        raise MicrospecError(message)
