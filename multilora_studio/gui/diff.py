"""Where two streamed texts first differ (plain Python, used by the Compare view)."""

from __future__ import annotations


def first_difference(base: str, other: str, base_done: bool, other_done: bool, start: int = 0) -> int | None:
    """The index of the first character where ``other`` departs from ``base``, once it is known.

    Texts only grow while they stream, so a difference inside both texts is final. If one
    text is a prefix of the other, the answer is known only when the shorter one is done
    (its length: ``other`` says more, or stops early); None while it is not known yet or
    when both finished identical. ``start`` is a prefix length already known to agree.
    """
    shared = min(len(base), len(other))
    for index in range(min(start, shared), shared):
        if base[index] != other[index]:
            return index
    if len(base) == len(other):
        return None
    if (len(other) < len(base) and other_done) or (len(base) < len(other) and base_done):
        return shared
    return None


def utf16_offset(text: str, index: int) -> int:
    """Qt text positions count UTF-16 code units: the position of Python index ``index``."""
    return len(text[:index].encode("utf-16-le")) // 2
