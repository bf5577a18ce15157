"""The connection table's caps and its choice of which idle connection to close."""

from __future__ import annotations

from dataclasses import dataclass

from sidecar.edge.http.connections import ConnectionTable


@dataclass(eq=False)
class Conn:
    name: str
    evicted: bool = False

    def evict(self) -> None:
        self.evicted = True


def test_the_longest_idle_goes_first_and_busy_ones_never() -> None:
    """At the cap: the connection idle longest is closed; one made busy and idle again counts
    from its new idle moment; with none idle, the new one is refused."""
    table: ConnectionTable[Conn] = ConnectionTable(3, 3)
    a, b, c, d, e = (Conn(n) for n in "abcde")
    for conn in (a, b, c):
        assert table.open(conn, "10.0.0.1") is None
    table.set_idle(a, idle=False)
    table.set_idle(a, idle=True)  # a is now the newest idle
    assert table.open(d, "10.0.0.2") is None
    assert [x.evicted for x in (a, b, c)] == [False, True, False]
    for conn in (a, c, d):
        table.set_idle(conn, idle=False)
    assert table.open(e, "10.0.0.2") == "too_many_connections"
    assert (table.count.open, table.count.evicted, table.count.refused) == (3, 1, 1)


def test_a_client_at_its_cap_loses_only_its_own_idle_connection() -> None:
    """Per-address cap: the client's own longest idle connection makes room, never another's."""
    table: ConnectionTable[Conn] = ConnectionTable(10, 2)
    other, mine1, mine2, mine3 = Conn("o"), Conn("m1"), Conn("m2"), Conn("m3")
    table.open(other, "10.0.0.9")
    table.open(mine1, "10.0.0.1")
    table.open(mine2, "10.0.0.1")
    assert table.open(mine3, "10.0.0.1") is None
    assert (other.evicted, mine1.evicted, mine2.evicted) == (False, True, False)
    table.set_idle(mine2, idle=False)
    table.set_idle(mine3, idle=False)
    assert table.open(Conn("m4"), "10.0.0.1") == "too_many_client_connections"


def test_closing_twice_counts_once() -> None:
    """A connection evicted and then lost is counted out once."""
    table: ConnectionTable[Conn] = ConnectionTable(1, 1)
    a = Conn("a")
    table.open(a, "x")
    table.close(a)
    table.close(a)
    assert table.count.open == 0
    assert table.open(Conn("b"), "x") is None
