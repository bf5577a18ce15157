"""What the engine client raises of its own; :func:`client.translated` maps each to a 502.

Exception
└── EngineProtocolError        the engine's answer is not HTTP/1.1 the sidecar accepts
    └── UnsendableRequestError a request HTTP/1.1 cannot carry: never written
ConnectionResetError
└── StaleConnectionError       the engine closed the connection without one byte of an answer

Messages are the sidecar's own words (and llhttp's fixed reasons), never bytes the engine sent:
they reach the client in a 502 body.
"""

from __future__ import annotations


class EngineProtocolError(Exception):
    """The engine's answer broke HTTP/1.1: its framing, a field, or bytes it was not asked for."""


class UnsendableRequestError(EngineProtocolError):
    """A request line or field that HTTP/1.1 cannot carry (a line break, a NUL)."""


class StaleConnectionError(ConnectionResetError):
    """The engine closed a connection before one byte of an answer came back on it."""


def broken_answer(exc: Exception, reason: str | None = None) -> EngineProtocolError:
    """llhttp's refusal as the engine client's error: llhttp's reason is one of its own fixed
    phrases, never the engine's bytes, so the message may reach the client."""
    error = EngineProtocolError(f"the engine's answer is not valid HTTP/1.1: {reason or exc}")
    error.__cause__ = exc
    return error
