"""The edge's errors that subclass a builtin exception other than Exception.

A module of their own, which the compiled build (setup.py) leaves as Python: mypyc cannot compile
a class that subclasses ``ConnectionResetError`` or ``ValueError``; code compiled elsewhere raises
and catches them as usual.
"""

from __future__ import annotations


class StaleConnectionError(ConnectionResetError):
    """A kept-alive connection that the engine had closed before it saw the request."""


class UnsendableHeadError(ValueError):
    """A status reason or field that HTTP/1.1 cannot carry (a line break)."""
