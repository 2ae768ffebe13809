"""A Horovod program's operations on hpcddp's timeline, as Horovod draws them: a lane
per tensor (``allreduce.<name>``, ``broadcast.<name>``, ...), its negotiation from submit
to its response's start, then the operation, with how many tensors were fused into it
(``HOROVOD_TIMELINE`` or ``HPCDDP_TIMELINE``); with ``HOROVOD_TIMELINE_MARK_CYCLES`` (or
``start_timeline(mark_cycles=True)``) a ``CYCLE_START`` moment for each round in which
the coordinator took requests."""

from typing import Dict, Tuple

from hpcddp import timeline

__all__ = ["CYCLE_LANE", "TIMELINE_LANE", "TensorLanes", "cycle", "mark_cycles"]

TIMELINE_LANE = 1000  # the timeline's lanes of tensors start here
CYCLE_LANE = TIMELINE_LANE - 1
_marking = [False]


def mark_cycles(on: bool) -> None:
    """Mark the coordinator's negotiation rounds from now (``on``) or not."""
    _marking[0] = on


def cycle() -> None:
    """A ``CYCLE_START`` moment, where cycles are marked and a timeline is recorded."""
    if _marking[0] and timeline.recording():
        timeline.name_lane(CYCLE_LANE, "negotiation cycles")
        timeline.instant("CYCLE_START", CYCLE_LANE)


def lane_name(kind: str, name: str) -> str:
    """Horovod's name of a tensor: its operation, a dot, the name it was given.

    >>> lane_name("allreduce", "fc.weight"), lane_name("allreduce", "allreduce.noname.3")
    ('allreduce.fc.weight', 'allreduce.noname.3')
    """
    return name if name.startswith(kind + ".") else f"{kind}.{name}"


class TensorLanes:
    """The lane of each (process set, operation, name) seen so far, numbered as they
    first run."""

    def __init__(self):
        self._lanes: Dict[Tuple[int, str, str], int] = {}

    def record(self, response, entries, began: int) -> None:
        """Mark ``entries``, run as ``response`` from ``began`` until now."""
        if not timeline.recording():
            return
        ended, kind = timeline.now(), response.kind.upper()
        for entry in entries:
            if entry.zeros or entry.submitted is None:
                continue
            key = (response.set_id, response.kind, entry.request.name)
            lane = self._lanes.get(key)
            if lane is None:
                lane = self._lanes[key] = TIMELINE_LANE + len(self._lanes)
                timeline.name_lane(lane, lane_name(response.kind, entry.request.name))
            timeline.mark(f"NEGOTIATE_{kind}", lane, entry.submitted, began)
            timeline.mark(kind, lane, began, ended, fused=len(entries))
