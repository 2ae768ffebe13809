"""Saying which ranks hold which value, for messages about ranks that disagree."""

from typing import Dict, Hashable, Iterable, List, Sequence, Tuple

__all__ = ["by_value", "ranks_text"]


def ranks_text(ranks: Sequence[int], limit: int = 8) -> str:
    """``"0,1,2"``, shortened to the first ``limit`` ranks and ``",..."``."""
    ranks = list(ranks)
    return ",".join(map(str, ranks[:limit])) + (",..." if len(ranks) > limit else "")


def by_value(values: Iterable[Hashable]) -> List[Tuple[Hashable, List[int]]]:
    """Group ranks by the value each holds (``values[r]`` is rank r's), in first-seen order."""
    groups: Dict[Hashable, List[int]] = {}
    for rank, value in enumerate(values):
        groups.setdefault(value, []).append(rank)
    return list(groups.items())
