"""A Horovod program's operations on hpcddp's timeline, as Horovod draws them: a lane
per tensor (``hvd <name>``), its negotiation from submit to its response's start, then
the operation, with how many tensors were fused into it (``HOROVOD_TIMELINE`` or
``HPCDDP_TIMELINE``)."""

from typing import Dict, Tuple

from hpcddp import timeline

__all__ = ["TIMELINE_LANE", "TensorLanes"]

TIMELINE_LANE = 1000  # the timeline's lanes of tensors start here


class TensorLanes:
    """The lane of each (process set, name) seen so far, numbered as they first run."""

    def __init__(self):
        self._lanes: Dict[Tuple[int, str], int] = {}

    def record(self, response, entries, began: int) -> None:
        """Mark ``entries``, run as ``response`` from ``began`` until now."""
        if not timeline.recording():
            return
        ended, kind = timeline.now(), response.kind.upper()
        for entry in entries:
            if entry.zeros or entry.submitted is None:
                continue
            key = (response.set_id, entry.request.name)
            lane = self._lanes.get(key)
            if lane is None:
                lane = self._lanes[key] = TIMELINE_LANE + len(self._lanes)
                timeline.name_lane(lane, f"hvd {entry.request.name}")
            timeline.mark(f"NEGOTIATE_{kind}", lane, entry.submitted, began)
            timeline.mark(kind, lane, began, ended, fused=len(entries))
