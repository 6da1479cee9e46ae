"""terminal.wrapped: lines broken between words, measured in terminal columns."""

from __future__ import annotations

from evald.terminal import columns, wrapped


def test_words_wrap_in_columns_a_wide_character_taking_two() -> None:
    """``検索結果`` is 4 characters and 8 columns: counted in characters, ``ab 検索結果``
    fit in 10."""
    assert wrapped("ab 検索結果 cd ef", 10, "  ") == ["ab", "  検索結果", "  cd ef"]
    assert all(columns(line) <= 10 for line in wrapped("ab 検索結果 cd ef", 10, "  "))


def test_a_word_wider_than_a_line_stays_whole_on_its_own_and_the_indent_is_kept() -> None:
    assert wrapped("  x yy zzzzzzzzzzzz w", 6, "    ") == ["  x yy", "    zzzzzzzzzzzz", "    w"]
    assert wrapped("fits", 6) == ["fits"]
