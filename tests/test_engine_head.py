"""The engine's head as the relay may pass it on: a status in 100-599, chunked as the only
transfer coding; anything else is the engine's protocol error (a 502 to the client)."""

from __future__ import annotations

import pytest

from sidecar.edge.engine.errors import EngineProtocolError
from sidecar.edge.engine.head import make_head


@pytest.mark.parametrize("status", [0, 99, 600, 999])
def test_a_status_outside_100_to_599_is_refused(status: int) -> None:
    """llhttp reads any three digits; HTTP has five classes."""
    with pytest.raises(EngineProtocolError, match="outside 100-599"):
        make_head(status, b"Weird", [(b"Content-Length", b"0")])


@pytest.mark.parametrize("status", [100, 200, 429, 599])
def test_a_status_inside_passes(status: int) -> None:
    """Every class of HTTP, its edges included."""
    assert make_head(status, b"", []).status == status


@pytest.mark.parametrize(
    "fields",
    [
        pytest.param([b"gzip, chunked"], id="gzip-then-chunked"),
        pytest.param([b"gzip"], id="gzip-alone"),
        pytest.param([b"chunked, chunked"], id="chunked-twice"),
        pytest.param([b"gzip", b"chunked"], id="two-fields"),
        pytest.param([b"identity"], id="identity"),
        pytest.param([b""], id="empty"),
    ],
)
def test_any_transfer_coding_but_a_lone_chunked_is_refused(fields: list[bytes]) -> None:
    """The relay decodes chunked only; a coding it would drop the label of is refused."""
    with pytest.raises(EngineProtocolError, match="transfer coding"):
        make_head(200, b"OK", [(b"Transfer-Encoding", value) for value in fields])


@pytest.mark.parametrize("value", [b"chunked", b"Chunked", b" chunked "])
def test_a_lone_chunked_passes(value: bytes) -> None:
    """chunked, in any case, with the whitespace a field value may carry."""
    head = make_head(200, b"OK", [(b"Transfer-Encoding", value)])
    assert head.fields["Transfer-Encoding"].strip().lower() == "chunked"
