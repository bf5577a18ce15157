"""Path normalisation and routing: one spelling per path, ambiguous encodings refused."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sidecar.core.errors import RequestError
from sidecar.edge.proxy.routes import (
    ProxyPaths,
    normalise_path,
    parse_forward_paths,
    parse_free_paths,
    route,
)

FREE = ProxyPaths()  # the defaults: DEFAULT_FREE_PATHS free, DEFAULT_FORWARD_PATHS forwarded


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        pytest.param("/v1/chat/completions", "/v1/chat/completions", id="plain"),
        pytest.param("/v1/./chat/completions", "/v1/chat/completions", id="dot-segment"),
        pytest.param("/v1/x/../chat/completions", "/v1/chat/completions", id="dot-dot"),
        pytest.param("//v1//chat///completions", "/v1/chat/completions", id="repeated-slashes"),
        pytest.param("/v1/%2E/completions", "/v1/completions", id="encoded-dot"),
        pytest.param("/v1/%2e%2e/v1/completions", "/v1/completions", id="encoded-dot-dot"),
        pytest.param("/v1/chat%2Dcompletions", "/v1/chat-completions", id="encoded-unreserved"),
        pytest.param("/../../v1/completions", "/v1/completions", id="above-root-clamped"),
        pytest.param("/v1/models/", "/v1/models/", id="trailing-slash-kept"),
        pytest.param("/v1/a%20b", "/v1/a%20b", id="reserved-escape-kept"),
        pytest.param("/v1/a%7e", "/v1/a~", id="lowercase-hex-unreserved"),
        pytest.param("/", "/", id="root"),
    ],
)
def test_normalise_gives_the_one_spelling(raw: str, expected: str) -> None:
    """Each spelling normalises to the path the engine would route on."""
    assert normalise_path(raw) == expected


@pytest.mark.parametrize(
    "raw",
    [
        pytest.param("/v1%2Fchat/completions", id="encoded-slash"),
        pytest.param("/v1%2fchat/completions", id="encoded-slash-lower"),
        pytest.param("/v1%5Cchat", id="encoded-backslash"),
        pytest.param("/v1\\chat", id="backslash"),
        pytest.param("/v1%00", id="encoded-nul"),
        pytest.param("/v1%zz", id="bad-escape"),
        pytest.param("/v1%2", id="short-escape"),
        pytest.param("/v1%252F", id="double-encoding"),
        pytest.param("http://evil/v1/completions", id="absolute-form"),
        pytest.param("*", id="asterisk"),
        pytest.param("/v1#frag", id="fragment"),
    ],
)
def test_ambiguous_spellings_are_refused(raw: str) -> None:
    """An encoding a server could read two ways is a 400, never a guess."""
    with pytest.raises(RequestError) as caught:
        normalise_path(raw)
    assert (caught.value.status, caught.value.code) == (400, "ambiguous_path")


@pytest.mark.parametrize(
    ("method", "target", "kind", "path_qs"),
    [
        pytest.param("POST", "/v1/./chat/completions", "priced", "/v1/chat/completions", id="chat"),
        pytest.param("POST", "//v1/completions?x=1", "priced", "/v1/completions?x=1", id="query"),
        pytest.param("POST", "/v1/responses", "priced", "/v1/responses", id="responses"),
        pytest.param("POST", "/v1/embeddings", "admitted", "/v1/embeddings", id="other-post"),
        pytest.param("PUT", "/v1/chat/completions", "admitted", "/v1/chat/completions", id="put"),
        pytest.param("GET", "/v1/models", "free", "/v1/models", id="get"),
        pytest.param("POST", "/x/../tokenize", "free", "/tokenize", id="free-path"),
    ],
)
def test_route_admits_every_generating_request(
    method: str, target: str, kind: str, path_qs: str
) -> None:
    """Priced routes, other POSTs and free paths are told apart on the normalised path."""
    routed = route(method, target, FREE)
    assert (routed.kind, routed.path_qs) == (kind, path_qs)


def test_free_paths_setting_is_normalised() -> None:
    """SIDECAR_FREE_PATHS entries are normalised like request paths."""
    assert parse_free_paths(" /tokenize, //detokenize/./ ,") == {"/tokenize", "/detokenize/"}


SEGMENTS = st.lists(
    st.sampled_from(["v1", "chat", "completions", ".", "..", "", "%2E", "%2e%2E", "a~", "%41"]),
    max_size=8,
)


@given(SEGMENTS)
def test_normalised_paths_are_fixed_points(segments: list[str]) -> None:
    """Normalising twice changes nothing; no dot segment or empty segment survives."""
    path = normalise_path("/" + "/".join(segments))
    assert normalise_path(path) == path
    inner = path.strip("/").split("/")
    assert "." not in inner
    assert ".." not in inner
    assert "//" not in path


@given(st.text(max_size=40))
def test_any_text_normalises_or_is_refused_cleanly(text: str) -> None:
    """Whatever the path, the answer is a normalised path or a 400, never another exception."""
    try:
        path = normalise_path("/" + text)
    except RequestError as exc:
        status = exc.status
    else:
        status = 200
        assert path.startswith("/")
        assert normalise_path(path) == path
    assert status in (200, 400)


@pytest.mark.parametrize(
    ("path", "forwarded"),
    [
        pytest.param("/v1/chat/completions", True, id="chat"),
        pytest.param("/v1/models", True, id="models"),
        pytest.param("/v1/audio/speech", True, id="other-api"),
        pytest.param("/health", True, id="health"),
        pytest.param("/tokenize", True, id="free-path"),
        pytest.param("/metrics", False, id="engine-metrics"),
        pytest.param("/v1", False, id="v1-itself"),
        pytest.param("/v1x/models", False, id="v1-lookalike"),
        pytest.param("/health/x", False, id="health-exact-only"),
        pytest.param("/tokenize/", False, id="free-path-exact-only"),
        pytest.param("/sleep", False, id="engine-admin"),
        pytest.param("/", False, id="root"),
    ],
)
def test_only_the_engines_api_is_forwarded_by_default(path: str, *, forwarded: bool) -> None:
    """/v1/..., /health and the free paths reach the engine; any other path is a 404."""
    if forwarded:
        assert route("GET", path, FREE).path == path
    else:
        with pytest.raises(RequestError) as caught:
            route("GET", path, FREE)
        assert (caught.value.status, caught.value.code) == (404, "not_found")


def test_forward_paths_add_exact_paths_and_prefixes() -> None:
    """SIDECAR_FORWARD_PATHS replaces the default: exact entries, and prefixes ending in '/'."""
    paths = ProxyPaths(forwarded=parse_forward_paths("/metrics, //pooling/ ,"))
    assert paths.forwarded == ("/metrics", "/pooling/")
    assert route("GET", "/metrics", paths).kind == "free"
    assert route("POST", "/pooling/x", paths).kind == "admitted"
    assert route("POST", "/tokenize", paths).kind == "free"
    with pytest.raises(RequestError):
        route("POST", "/v1/completions", paths)
