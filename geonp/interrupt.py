"""Ctrl-C that a library cannot lose.

Python raises ``KeyboardInterrupt`` wherever the main thread is when SIGINT arrives. Inside a
``__del__`` or a weakref callback (file managers closing netCDF handles, for instance) the
exception is printed as "ignored" and dropped, so an infill kept writing blocks to the end after
Ctrl-C in about one run in four of the suite's resume test. :func:`catch_ctrl_c` keeps the usual
``KeyboardInterrupt`` and also remembers the key press; loops over blocks call
:func:`stop_if_pressed` between blocks, so a dropped interrupt stops the run at the next one.
"""

from __future__ import annotations

import signal
import threading

_pressed = threading.Event()


def _on_ctrl_c(signum: int, frame: object) -> None:
    _pressed.set()
    raise KeyboardInterrupt


def catch_ctrl_c() -> None:
    """Route SIGINT through a handler that also remembers it. Only from the main thread, and only
    where SIGINT has Python's default handler (a background job that ignores it keeps ignoring it)."""
    _pressed.clear()
    if threading.current_thread() is threading.main_thread() and \
            signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        signal.signal(signal.SIGINT, _on_ctrl_c)


def stop_if_pressed() -> None:
    """Raise ``KeyboardInterrupt`` if Ctrl-C was pressed since :func:`catch_ctrl_c`."""
    if _pressed.is_set():
        raise KeyboardInterrupt
