"""QueryTable: the pending lists' queries interned and recycled."""

from __future__ import annotations

from evald.join.queries import NO_QUERY, QueryTable
from evald.query import QueryNormalizer


def test_queries_are_normalised_interned_and_recycled() -> None:
    table = QueryTable(QueryNormalizer(50))
    a = table.acquire("Red Shoes")
    assert table.acquire("red  shoes") == a  # one normalised query, one entry
    assert table.texts[a] == "red shoes"
    assert table.acquire(None) == NO_QUERY and table.acquire(" \t ") == NO_QUERY
    b = table.acquire("lamp")
    assert len(table) == 2
    table.release(a, 2)
    assert len(table) == 1 and table.texts[a] == ""
    assert table.acquire("desk") == a  # the freed id is used again
    table.release(NO_QUERY)  # no query: nothing to release
    table.release(b)
    assert len(table) == 1


def test_the_table_is_bounded_by_what_is_held_not_by_what_was_seen() -> None:
    table = QueryTable(QueryNormalizer(50))
    for i in range(10_000):
        table.release(table.acquire(f"query {i}"))
    assert len(table) == 0 and len(table.texts) == 2  # id 0 plus one recycled entry
