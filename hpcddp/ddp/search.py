"""The autotuner's search: which bucket setting to measure next, and when to stop.

A pure function of the costs it is told, so every rank that is told the same costs (the
slowest rank's, agreed each step) walks the same path and settles on the same setting at
the same step. No torch, no MPI: unit tests feed it a known cost surface.

The space has four coordinates: the reduction (MPI's allreduce, the ring, node-aware),
whether large host parameters are reduced in their own gradient (``solo``), the bucket
cap and the first bucket's cap. The search is coordinate descent: every value of a
categorical coordinate is tried; an ordered one (the caps, on a doubling ladder) is
climbed from where it stands towards the cheaper neighbour until the next step up the
ladder is no longer cheaper. A pass over all coordinates that changed nothing ends it;
so does the step budget. A best that is not the start is then measured again beside the
start, and kept only if it still wins by the margin, both side by side and with all its
samples pooled. A candidate whose first measured step costs far more than the
best so far is dropped after that step (Horovod's autotune spends its budget the same
way: few samples where a setting is plainly worse).
"""

import statistics
from typing import Dict, List, NamedTuple, Optional, Sequence, Tuple

__all__ = ["CAP_LADDER_MB", "FIRST_LADDER_MB", "Search", "Setting", "Space", "Trial"]

# Bucket caps tried, in MiB; 25 is torch's default. Caps past the model's gradient bytes
# all mean one bucket, so the ladder is cut there (``Space.for_model``).
CAP_LADDER_MB = (0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 25.0, 32.0, 64.0, 128.0, 256.0)
FIRST_LADDER_MB = (0.125, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0)


class Setting(NamedTuple):
    """One point of the space."""

    reduction: str
    solo: bool
    cap_mb: float
    first_mb: float  # equal to cap_mb: the first bucket is as large as the others

    def describe(self) -> str:
        first = "as the others" if self.first_mb >= self.cap_mb else f"{self.first_mb:g} MiB"
        return (f"reduction={self.reduction}, bucket_cap_mb={self.cap_mb:g}, first bucket "
                f"{first}, large parameters {'alone' if self.solo else 'in buckets'}")


class Space(NamedTuple):
    """The values each coordinate may take."""

    reductions: Tuple[str, ...]
    solos: Tuple[bool, ...]
    caps: Tuple[float, ...]  # ascending

    @classmethod
    def for_model(cls, reductions: Sequence[str], solos: Sequence[bool],
                  gradient_bytes: int) -> "Space":
        """The space for a model of ``gradient_bytes``: every cap below it, and the first
        one at or above it (one bucket)."""
        total_mb = gradient_bytes / (1 << 20)
        caps = [c for c in CAP_LADDER_MB if c < total_mb]
        caps.append(next((c for c in CAP_LADDER_MB if c >= total_mb), CAP_LADDER_MB[-1]))
        return cls(tuple(dict.fromkeys(reductions)), tuple(dict.fromkeys(solos)), tuple(caps))

    def firsts(self, cap_mb: float) -> Tuple[float, ...]:
        """The first bucket's caps under ``cap_mb``: the ladder below it, then ``cap_mb``."""
        return tuple(f for f in FIRST_LADDER_MB if f < cap_mb) + (cap_mb,)

    def nearest_cap(self, cap_mb: float) -> float:
        return min(self.caps, key=lambda c: (abs(c - cap_mb), c))

    def snap(self, setting: Setting) -> Setting:
        """``setting`` moved onto the space (a user's cap of 20 MiB becomes 16 or 25)."""
        cap = self.nearest_cap(setting.cap_mb)
        firsts = self.firsts(cap)
        first = min(firsts, key=lambda f: (abs(f - min(setting.first_mb, cap)), f))
        reduction = setting.reduction if setting.reduction in self.reductions \
            else self.reductions[0]
        solo = setting.solo if setting.solo in self.solos else self.solos[0]
        return Setting(reduction, solo, cap, first)


class Trial(NamedTuple):
    """What was measured of one setting."""

    setting: Setting
    samples: Tuple[float, ...]
    cost: float          # the median of the samples
    abandoned: bool      # dropped after one sample: plainly worse than the best


class Search:
    """Coordinate descent over ``space`` from ``start``, fed one agreed cost per step.

    Args:
        space: the values each coordinate may take.
        start: the first setting measured (the defaults, or the user's).
        samples: measured steps per setting; their median is its cost.
        warmup: steps after each switch that are not measured (new buffers, first
            messages of a new layout).
        budget: the most steps the search may take, warm-up steps included.
        margin: a setting replaces the best only when cheaper by this fraction, so noise
            does not move the choice.
        abandon: a setting whose first sample exceeds the best cost by this factor is
            dropped after it.
        confirm: measure the start and the best again before leaving the start.

    Example::

        search = Search(space, start)
        while not search.done:
            run_one_step(search.current)
            search.observe(cost_of_that_step)
        search.best.setting
    """

    ORDER = ("reduction", "solo", "cap_mb", "first_mb")

    def __init__(self, space: Space, start: Setting, samples: int = 3, warmup: int = 1,
                 budget: int = 64, margin: float = 0.03, abandon: float = 1.3,
                 confirm: bool = True):
        if samples < 1 or warmup < 0 or budget < 1:
            raise ValueError(f"samples={samples}, warmup={warmup}, budget={budget}: need "
                             f"samples >= 1, warmup >= 0 and budget >= 1")
        self.space, self.samples, self.warmup = space, samples, warmup
        self.budget, self.margin, self.abandon = budget, margin, abandon
        self.trials: Dict[Setting, Trial] = {}
        self.history: List[Trial] = []
        self.steps = 0
        self.best: Optional[Trial] = None
        self.done = False
        self._changed_this_pass = False
        self._coord = 0
        self._queue: List[Setting] = []
        # The climb going on: (coordinate, where it stood, direction; None while both
        # neighbours are being measured).
        self._climb: Optional[Tuple[str, float, Optional[int]]] = None
        self.start = self.current = space.snap(start)
        # Before leaving the start, both are measured again and their samples pooled: a
        # lucky run of steps must not move the choice. Its steps are kept in the budget.
        self._confirming: Optional[List[Setting]] = None
        per = warmup + samples  # steps per setting
        self._reserve = 2 * per if confirm and budget >= 4 * per else 0
        self._seen: List[float] = []
        self._skip = warmup  # the start too is a switch: to the tuner's own buckets

    # -- fed by the tuner ----------------------------------------------------------------

    def observe(self, cost: float) -> None:
        """Take the agreed cost of one step run with ``current``."""
        if self.done:
            return
        self.steps += 1
        if self._skip:
            self._skip -= 1
        else:
            self._seen.append(float(cost))
            if self._plainly_worse() or len(self._seen) >= self.samples:
                self._conclude()
        if not self.done and self.steps >= self.budget - \
                (0 if self._confirming is not None else self._reserve):
            self._finish()

    @property
    def best_setting(self) -> Setting:
        return self.best.setting if self.best is not None else self.current

    # -- inside ----------------------------------------------------------------------

    def _plainly_worse(self) -> bool:
        return (len(self._seen) == 1 and self.samples > 1 and self.best is not None
                and self._confirming is None and self._seen[0] > self.best.cost * self.abandon)

    def _conclude(self) -> None:
        if self._confirming is not None:
            self._conclude_confirmation()
            return
        samples = tuple(self._seen)
        trial = Trial(self.current, samples, statistics.median(samples),
                      len(samples) < self.samples)
        self.trials[self.current] = trial
        self.history.append(trial)
        if self.best is None or trial.cost < self.best.cost * (1 - self.margin):
            if self.best is not None:
                self._changed_this_pass = True
            self.best = trial
            improved = True
        else:
            improved = False
        self._advance(improved)

    def _advance(self, improved: bool) -> None:
        """Pick the next setting to measure, or finish."""
        nxt = self._next_setting(improved)
        if nxt is None:
            self._finish()
            return
        self.current, self._seen, self._skip = nxt, [], self.warmup

    def _next_setting(self, improved: bool) -> Optional[Setting]:
        while True:
            if self._queue:
                return self._queue.pop(0)
            step = self._climb_on(improved)
            if step is not None:
                return step
            if self._coord >= len(self.ORDER):
                if not self._changed_this_pass:
                    return None
                self._coord, self._changed_this_pass = 0, False
            coord = self.ORDER[self._coord]
            self._coord += 1
            self._queue = self._candidates(coord)

    def _climb_on(self, improved: bool) -> Optional[Setting]:
        """The next step of the climb along an ordered coordinate, or None when it ends.

        Both neighbours of the best are measured first; if one of them became the best,
        the climb goes on in its direction while each step keeps improving."""
        if self._climb is None:
            return None
        coord, origin, direction = self._climb
        best = self.best.setting
        if direction is None:  # both neighbours measured
            moved = getattr(best, coord) - origin
            direction = (moved > 0) - (moved < 0)
        elif not (improved and best == self.history[-1].setting):
            direction = 0
        step = self._neighbour(best, coord, direction) if direction else None
        self._climb = (coord, getattr(best, coord), direction) if step is not None else None
        return step

    def _candidates(self, coord: str) -> List[Setting]:
        """The settings to try along ``coord`` from the best: every other value of a
        categorical coordinate; both neighbours of an ordered one (a climb follows)."""
        best = self.best.setting
        if coord in ("reduction", "solo"):
            values = self.space.reductions if coord == "reduction" else self.space.solos
            return [s for s in (best._replace(**{coord: v}) for v in values)
                    if s not in self.trials]
        neighbours = [step for step in (self._neighbour(best, coord, d) for d in (-1, 1))
                      if step is not None]
        if neighbours:
            self._climb = (coord, getattr(best, coord), None)
        return neighbours

    def _neighbour(self, setting: Setting, coord: str, direction: int) -> Optional[Setting]:
        """The adjacent setting along an ordered coordinate; None past the end of the
        ladder or where it was measured already (it was no better, or it would be best)."""
        if coord == "cap_mb":
            ladder, value = self.space.caps, setting.cap_mb
        else:
            ladder, value = self.space.firsts(setting.cap_mb), setting.first_mb
        at = ladder.index(value) + direction
        if not 0 <= at < len(ladder):
            return None
        if coord == "cap_mb":
            cap = ladder[at]
            first = cap if setting.first_mb >= setting.cap_mb else min(setting.first_mb, cap)
            candidate = setting._replace(cap_mb=cap, first_mb=first)
        else:
            candidate = setting._replace(first_mb=ladder[at])
        return None if candidate in self.trials else candidate

    def settle_on(self, setting: Setting) -> None:
        """Stop searching and keep ``setting`` (a choice made before, from a checkpoint)."""
        self.done, self.current = True, setting

    def stop(self) -> None:
        """Stop searching; ``best_setting`` is the choice."""
        self.done = True

    def _finish(self) -> None:
        if (self._confirming is None and self._reserve and self.best is not None
                and self.best.setting != self.start and self.start in self.trials
                and self.budget - self.steps >= self._reserve):
            self._confirming = [self.best.setting]
            self.current, self._seen, self._skip = self.start, [], self.warmup
            return
        self.done = True
        self.current = self.best_setting

    def _conclude_confirmation(self) -> None:
        """Pool the new samples with the earlier ones; once the start and the best have
        both been measured again, keep the best only if it wins by the margin both in the
        pooled samples and in the two measures just taken side by side."""
        fresh = tuple(self._seen)
        self.history.append(Trial(self.current, fresh, statistics.median(fresh), False))
        pooled = self.trials[self.current].samples + fresh
        self.trials[self.current] = Trial(self.current, pooled, statistics.median(pooled), False)
        if self._confirming:
            self.current, self._seen, self._skip = self._confirming.pop(), [], self.warmup
            return
        start, best = self.trials[self.start], self.trials[self.best.setting]
        again = {t.setting: t.cost for t in self.history[-2:]}  # side by side, just now
        wins = (best.cost < start.cost * (1 - self.margin) and
                again[best.setting] < again[start.setting] * (1 - self.margin))
        self.best = best if wins else start
        self._confirming = []
        self.done = True
        self.current = self.best.setting
