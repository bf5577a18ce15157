"""The connection table's caps and its choice of which connection to close to make room."""

from __future__ import annotations

from dataclasses import dataclass

from sidecar.core.outcomes import EdgeFault
from sidecar.edge.http.connections import ConnectionTable
from tests.fake_time import FakeTime


@dataclass(eq=False)
class Conn:
    name: str
    evicted: bool = False
    answer: EdgeFault | None = None

    moved: int | None = None  # bytes moved while it waits on its client; None: it does not
    held: int = 0  # bytes it holds in the process

    def evict(self, fault: EdgeFault | None) -> None:
        self.evicted, self.answer = True, fault

    def waiting_on_client(self) -> int | None:
        return self.moved

    def held_bytes(self) -> int:
        return self.held


def _table(
    total: int, per_client: int, partial: int = 100
) -> tuple[ConnectionTable[Conn], FakeTime]:
    clock = FakeTime()
    return ConnectionTable(total, per_client, partial, grace_s=1.0, clock=clock.clock), clock


def test_the_longest_idle_goes_first_and_busy_ones_never() -> None:
    """At the cap with no stale partial head: the connection idle longest is closed; one made
    busy and idle again counts from its new idle moment; with none idle, the new one is refused."""
    table, _clock = _table(3, 3)
    a, b, c, d, e = (Conn(n) for n in "abcde")
    for conn in (a, b, c):
        assert table.open(conn, "10.0.0.1") is None
        table.mark(conn, "idle")
    table.mark(a, "busy")
    table.mark(a, "idle")  # a is now the newest idle
    assert table.open(d, "10.0.0.2") is None
    assert [(x.evicted, x.answer) for x in (a, b, c)] == [
        (False, None),
        (True, None),
        (False, None),
    ]
    for conn in (a, c, d):
        table.mark(conn, "busy")
    assert table.open(e, "10.0.0.2") == "too_many_connections"
    assert (table.count.open, table.count.evicted, table.count.refused) == (3, 1, 1)


def test_a_stale_partial_head_goes_before_any_idle_connection() -> None:
    """A head held open past the grace is closed first, with a 503 of its own, though an idle
    connection has been idle longer; a partial head within its grace is never closed."""
    table, clock = _table(3, 3)
    idle, stale, fresh = Conn("idle"), Conn("stale"), Conn("fresh")
    table.open(idle, "10.0.0.1")
    table.mark(idle, "idle")
    table.open(stale, "10.0.0.2")
    clock.advance(1.5)
    table.open(fresh, "10.0.0.3")
    assert table.open(Conn("new"), "10.0.0.4") is None
    assert (stale.evicted, stale.answer) == (True, "too_many_partial_heads")
    assert not idle.evicted
    assert not fresh.evicted


def test_partial_heads_past_their_budget_close_the_oldest_stale_one() -> None:
    """Past the budget of partial heads the oldest stale one is closed though the port has room;
    within the grace none is, and the new one is let in (the caps still bound it)."""
    table, clock = _table(100, 100, partial=2)
    first, second = Conn("first"), Conn("second")
    table.open(first, "10.0.0.1")
    table.open(second, "10.0.0.1")
    assert table.open(Conn("young"), "10.0.0.2") is None
    assert not first.evicted
    clock.advance(1.5)
    assert table.open(Conn("late"), "10.0.0.2") is None
    assert (first.evicted, second.evicted) == (True, False)
    assert table.partial == 3


def test_at_the_port_cap_the_address_with_most_heads_gives_one_up() -> None:
    """With only young heads at the port's cap, the address holding the most gives up its
    oldest for a newcomer from elsewhere; a newcomer from that address itself is refused."""
    table, _clock = _table(4, 4)
    flood = [Conn(f"f{i}") for i in range(3)]
    for conn in flood:
        table.open(conn, "10.0.0.2")
    table.open(Conn("one"), "10.0.0.3")
    assert table.open(Conn("own"), "10.0.0.2") == "too_many_connections"
    assert table.open(Conn("other"), "10.0.0.4") is None
    assert [(c.evicted, c.answer) for c in flood] == [
        (True, "too_many_partial_heads"),
        (False, None),
        (False, None),
    ]


def test_a_client_at_its_cap_closes_its_own_heads_then_its_own_idle() -> None:
    """Per-address cap as a share: the address's own stale head makes room, then its own idle
    connection; never another address's; only with neither is it refused."""
    table, clock = _table(10, 2)
    other, head, idle = Conn("other"), Conn("head"), Conn("idle")
    table.open(other, "10.0.0.9")
    table.open(head, "10.0.0.1")
    table.open(idle, "10.0.0.1")
    table.mark(idle, "idle")
    clock.advance(1.5)
    fresh = Conn("fresh")
    assert table.open(fresh, "10.0.0.1") is None
    assert (other.evicted, head.answer, idle.evicted) == (False, "too_many_partial_heads", False)
    assert table.open(Conn("next"), "10.0.0.1") is None
    assert (idle.evicted, idle.answer) == (True, None)
    table.mark(fresh, "busy")
    assert table.open(Conn("last"), "10.0.0.1") == "too_many_client_connections"


def test_a_head_that_begins_on_a_kept_alive_connection_is_partial_again() -> None:
    """An idle connection whose next head has begun counts as partial from that moment."""
    table, clock = _table(2, 2)
    kept, busy = Conn("kept"), Conn("busy")
    table.open(kept, "10.0.0.1")
    table.open(busy, "10.0.0.1")
    table.mark(busy, "busy")
    table.mark(kept, "idle")
    clock.advance(5)
    table.mark(kept, "partial")
    assert table.open(Conn("new"), "10.0.0.2") == "too_many_connections"
    clock.advance(1.5)
    assert table.open(Conn("new"), "10.0.0.2") is None
    assert kept.answer == "too_many_partial_heads"


def test_closing_twice_counts_once() -> None:
    """A connection evicted and then lost is counted out once."""
    table, _clock = _table(1, 1)
    a = Conn("a")
    table.open(a, "x")
    table.close(a)
    table.close(a)
    assert table.count.open == 0
    assert table.open(Conn("b"), "x") is None


def _busy(table: ConnectionTable[Conn], client: str, *moved: int | None) -> list[Conn]:
    conns = [Conn(f"{client}-{i}", moved=m) for i, m in enumerate(moved)]
    for conn in conns:
        assert table.open(conn, client) is None
        table.mark(conn, "busy")
    return conns


def test_at_the_port_cap_the_slowest_busy_of_the_top_holder_goes() -> None:
    """A full port of busy connections: a newcomer from another address closes the one of the
    address holding most that moved the fewest bytes a second while waiting on its client; one
    not waiting on its client (running at the engine) is never closed, whatever it moved."""
    table, clock = _table(6, 6)
    a = _busy(table, "10.0.0.1", 9_000, None, 300, 5_000)
    b = _busy(table, "10.0.0.2", 0, 0)
    clock.advance(2.0)
    assert table.open(Conn("new"), "10.0.0.3") is None
    assert [conn.evicted for conn in a + b] == [False, False, True, False, False, False]
    assert (table.count.evicted, table.count.evicted_busy) == (1, 1)


def test_a_busy_connection_within_its_grace_is_left_alone() -> None:
    """Busy for less than the grace, a connection that has moved nothing yet is not judged
    slow: the newcomer is refused instead."""
    table, clock = _table(2, 2)
    young = _busy(table, "10.0.0.1", 0, 0)
    clock.advance(0.5)
    assert table.open(Conn("new"), "10.0.0.2") == "too_many_connections"
    assert not any(conn.evicted for conn in young)


def test_an_address_holding_no_more_than_the_newcomer_keeps_its_own() -> None:
    """Two addresses of two connections each: a third from one of them takes nothing from the
    other (it would hold no more than it): the port's cap refuses it."""
    table, clock = _table(4, 4)
    first = _busy(table, "10.0.0.1", 0, 0)
    second = _busy(table, "10.0.0.2", 0, 0)
    clock.advance(2.0)
    assert table.open(Conn("new"), "10.0.0.2") == "too_many_connections"
    assert not any(conn.evicted for conn in first + second)


def test_a_client_at_its_cap_closes_its_own_slowest_busy() -> None:
    """At its own cap, with no head or idle connection of its own, a client's newest connection
    takes the room of its own slowest busy one that waits on its client."""
    table, clock = _table(100, 3)
    own = _busy(table, "10.0.0.1", 800, 100, None)
    clock.advance(2.0)
    assert table.open(Conn("new"), "10.0.0.1") is None
    assert [conn.evicted for conn in own] == [False, True, False]


def test_shedding_closes_those_holding_most_while_doing_least() -> None:
    """Shed two: of a partial head, an idle connection and a busy one waiting on its client,
    the two holding the most bytes go; a busy one at work, or waiting for less than the grace,
    is never shed, whatever it holds."""
    table, _clock = _table(10, 10)
    head, idle = Conn("head", held=500), Conn("idle", held=100)
    table.open(head, "10.0.0.1")
    table.open(idle, "10.0.0.1")
    table.mark(idle, "idle")
    (waiting,) = _busy(table, "10.0.0.2", 0)
    waiting.held = 4_000
    (working,) = _busy(table, "10.0.0.2", None)
    working.held = 1 << 20
    _clock.advance(2.0)
    (young,) = _busy(table, "10.0.0.2", 0)  # waiting on its client for less than the grace
    young.held = 1 << 20
    assert table.shed(0.5) == 2  # half of the three doing least, rounded up
    assert [c.evicted for c in (head, idle, waiting, working, young)] == [
        True,
        False,
        True,
        False,
        False,
    ]
    assert head.answer == "too_many_connections"


def test_a_port_not_accepting_refuses_every_newcomer() -> None:
    """While the overload manager says stop, a new connection is refused though there is room."""
    table, _clock = _table(10, 10)
    table.accepting = False
    assert table.open(Conn("new"), "10.0.0.1") == "too_many_connections"
    table.accepting = True
    assert table.open(Conn("later"), "10.0.0.1") is None
