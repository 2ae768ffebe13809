"""``bucket_cap_mb="auto"``: bucket settings chosen from measured steps, agreed by all ranks.

During the first synchronized steps the autotuner measures, on every rank, the time from
backward's first gradient to the moment every bucket is reduced and back in ``.grad``:
backward plus the communication it did not hide. That is all a bucket setting changes
(forward and the optimizer step are the same under every setting). Before each step the
ranks agree on the last step's cost, the slowest rank's, with one small allreduce on the
wrapper's control communicator, and feed it to the search (``search.py``); every rank is
thus told the same costs and switches to the same setting at the same step. Buckets
change only between steps, so every step reduces exactly the gradients a fixed setting
would.

What was tried is printed on rank 0 when the search settles, written as CSV to
``HPCDDP_AUTOTUNE_LOG`` (one row per setting, as Horovod's autotune log), recorded in the
timeline, and saved with ``hpcddp.checkpoint``: a resume with the same world, network
and model takes the saved choice instead of searching again.
"""

import csv
import sys
from typing import Optional

import numpy as np
import torch
from mpi4py import MPI

from hpcddp import timeline
from hpcddp.comm import activity
from hpcddp.ddp.search import Search, Setting, Space
from hpcddp.env import get_setting
from hpcddp.env.notices import warn_user
from hpcddp.startup.mpi_library import library_version_line
from hpcddp.transport.allreduce import policy

__all__ = ["Autotuner", "apply_setting", "make_autotuner", "wants_autotune"]

_MIB = 1 << 20
_LOG_FIELDS = ("trial", "reduction", "bucket_cap_mb", "first_bucket_mb", "large_params_alone",
               "measured_steps", "samples_ms", "cost_ms", "abandoned", "chosen")


def wants_autotune(bucket_cap_mb) -> bool:
    """Whether a wrapper given ``bucket_cap_mb`` tunes: ``"auto"``, or
    ``HPCDDP_AUTOTUNE=1`` (starting from a given cap). Any other text, or a cap of 0 MiB
    or less, is refused with the fix."""
    if isinstance(bucket_cap_mb, str) and bucket_cap_mb != "auto":
        raise ValueError(f"bucket_cap_mb={bucket_cap_mb!r}: give a number of MiB, None for "
                         f"torch's 25, or 'auto' to have hpcddp measure and choose")
    if bucket_cap_mb is not None and not isinstance(bucket_cap_mb, str) and \
            not bucket_cap_mb > 0:
        raise ValueError(f"bucket_cap_mb={bucket_cap_mb!r}: a bucket cap must be more than "
                         f"0 MiB; give e.g. 25, or 'auto'")
    return bucket_cap_mb == "auto" or get_setting("AUTOTUNE")


def apply_setting(reducer, setting: Setting, solo_bytes: int) -> None:
    """Give ``reducer`` the reduction and bucket layout of ``setting`` (large host
    parameters alone from ``solo_bytes`` where ``setting.solo``).

    .. warning:: Collective, between steps, as ``Reducer.retune``.
    """
    reducer.retune(setting.reduction, int(setting.cap_mb * _MIB),
                   int(min(setting.first_mb, setting.cap_mb) * _MIB),
                   solo_bytes if setting.solo else 0)


class Autotuner:
    """Searches bucket settings for one ``Reducer`` during the first steps, then keeps one.

    Args:
        reducer: the wrapper's reducer; its ``retune`` applies a setting.
        control: the wrapper's control communicator (the agreement travels there).
        reductions: the reductions to try (``policy.worth_trying``).
        start: the first setting, the defaults or the user's cap.
        solo_bytes: the size from which host parameters are reduced alone, when they are.
        budget: the most steps the search may take (``HPCDDP_AUTOTUNE_STEPS``).
        log_path: rank 0 writes the CSV log here ('' for none).
        fingerprint: what a saved choice must match to be reused (world, network, model).
    """

    def __init__(self, reducer, control, reductions, start: Setting, solo_bytes: int,
                 budget: int, log_path: str, fingerprint: dict):
        self.reducer, self.control = reducer, control
        self.is_main = control.rank == 0
        self.solo_bytes = solo_bytes
        dense = [p for i, p in enumerate(reducer.params) if i not in reducer.sparse]
        big = solo_bytes and any(p.device.type == "cpu" and p.numel() * p.element_size() >=
                                 solo_bytes for p in dense)
        solos = (start.solo, not start.solo) if big else (start.solo,)
        gradient_bytes = sum(p.numel() * p.element_size() for p in dense)
        self.space = Space.for_model(reductions, solos, gradient_bytes)
        self.search = Search(self.space, start, budget=budget)
        self.start = self.search.current
        self.fingerprint = fingerprint
        self.log_path = log_path if self.is_main else ""
        self._logged, self._log_begun = 0, False
        self._cuda = dense[0].is_cuda
        self._cost: Optional[float] = None  # this rank's last measured step, in seconds
        self._applied: Optional[Setting] = None
        self._since = 0
        self.settled = False
        self.reason = ""  # why the search ended, for the log line
        reducer.start_timing(self._measure)

    # -- the reducer's and the wrapper's calls --------------------------------------------

    def _measure(self, began: int) -> None:
        if self._cuda:
            torch.cuda.synchronize()  # the copies back are queued, not done
        self._cost = (timeline.now() - began) / 1e9

    def before_forward(self) -> None:
        """Agree on the last step's cost, feed it to the search and apply what it picks.

        .. warning:: Collective while the search runs: call on every rank before each
           synchronized forward.
        """
        if self.settled:
            return
        cost, self._cost = self._cost, None
        agreed = np.array([np.inf if cost is None else cost, cost is None], dtype=np.float64)
        with activity.named("DDP autotune: agreeing on the last step's cost"):
            self.control.Allreduce(MPI.IN_PLACE, agreed, op=MPI.MAX)
        if agreed[1]:
            return  # some rank ran no synchronized backward since: nothing to judge
        if self._applied is None:
            # After the first backward, whose order the reducer has just laid its buckets
            # out in: from here on, the tuner's buckets in that order. The first step's
            # cost (first-touch allocations, a static graph's delayed reduction) is not
            # a setting's.
            self._apply(self.search.current)
            return
        self.search.observe(float(agreed[0]))
        self._write_log()
        if self.search.done:
            self._settle("no neighbouring setting was cheaper"
                         if self.search.steps < self.search.budget else
                         f"the budget of {self.search.budget} steps was spent")
        elif self.search.current != self._applied:
            self._apply(self.search.current)

    def pause(self) -> None:
        """Forget the last measure (under Join, where not every rank trains)."""
        self._cost = None

    def stop(self, why: str) -> None:
        """End the search now with the best setting found (or the start)."""
        if not self.settled:
            self._settle(why)

    # -- checkpoints --------------------------------------------------------------------

    def state(self) -> Optional[dict]:
        """The choice and what it was measured on, once settled; else None."""
        if not self.settled:
            return None
        best = self.search.best
        return {"setting": dict(self.search.best_setting._asdict()),
                "cost_ms": None if best is None else best.cost * 1e3,
                "fingerprint": dict(self.fingerprint)}

    def load_state(self, saved: Optional[dict]) -> bool:
        """Take a saved choice where it was made on the same world, network and model;
        return whether it was taken. Collective: ``load`` calls it on every rank."""
        if not saved:
            return False
        if saved.get("fingerprint") != self.fingerprint:
            differ = sorted(k for k in set(self.fingerprint) | set(saved.get("fingerprint", {}))
                            if saved.get("fingerprint", {}).get(k) != self.fingerprint.get(k))
            warn_user(f"hpcddp autotune: the checkpoint's bucket setting was chosen on another "
                      f"{', '.join(differ)}; searching again", rank=self.control.rank)
            return False
        setting = Setting(**saved["setting"])
        self.search.settle_on(setting)
        self._apply(setting)
        self.settled, self.reason = True, "taken from the checkpoint"
        self.reducer.stop_timing()  # nothing more to measure (on a GPU, a synchronize a step)
        if self.is_main:
            print(f"hpcddp autotune: {setting.describe()} (chosen before, taken from the "
                  f"checkpoint: same world, network and model)", file=sys.stderr, flush=True)
        return True

    # -- inside ---------------------------------------------------------------------------

    def _apply(self, setting: Setting) -> None:
        now = timeline.now()
        if self._applied is not None:
            timeline.mark(f"autotune: {self._applied.describe()}", timeline.REDUCER,
                          self._since, now)
        apply_setting(self.reducer, setting, self.solo_bytes)
        self._applied, self._since = setting, now

    def _settle(self, why: str) -> None:
        self.search.stop()
        best = self.search.best_setting
        if self._applied is None:
            pass  # stopped before the first step: the wrapper keeps the layout it was built with
        elif best != self._applied:
            self._apply(best)
        else:
            timeline.mark(f"autotune: {best.describe()}", timeline.REDUCER, self._since)
        self.settled, self.reason = True, why
        self.reducer.stop_timing()
        self._write_log(final=True)
        if self.is_main:
            print(self.summary(), file=sys.stderr, flush=True)

    def summary(self) -> str:
        """One line: what was chosen, its cost against the start's, what it took."""
        search, best = self.search, self.search.best
        if best is None:
            return (f"hpcddp autotune: kept {search.best_setting.describe()} ({self.reason}, "
                    f"before any step was measured)")
        start = search.trials.get(self.start)
        against = "" if start is None or start.setting == best.setting else (
            f" against {start.cost * 1e3:.1f} ms at the start setting "
            f"({1 - best.cost / start.cost:.0%} less)")
        return (f"hpcddp autotune: chose {best.setting.describe()}: {best.cost * 1e3:.1f} ms "
                f"for backward and the communication after it{against}; {len(search.history)} "
                f"settings in {search.steps} steps, ended because {self.reason}")

    def _write_log(self, final: bool = False) -> None:
        """Append the settings measured since the last call; mark the choice at the end."""
        if not self.log_path:
            return
        history = self.search.history
        if self._logged == len(history) and not final and self._log_begun:
            return
        # Appended, never truncated: the file may hold an earlier run's search (a log is
        # data); a file begun elsewhere keeps its header.
        with open(self.log_path, "a", newline="") as out:
            writer = csv.writer(out)
            if not self._log_begun:
                if out.tell() == 0:
                    writer.writerow(_LOG_FIELDS)
                self._log_begun = True
            for k in range(self._logged, len(history)):
                trial = history[k]
                writer.writerow([k, trial.setting.reduction, trial.setting.cap_mb,
                                 min(trial.setting.first_mb, trial.setting.cap_mb),
                                 int(trial.setting.solo), len(trial.samples),
                                 " ".join(f"{x * 1e3:.3f}" for x in trial.samples),
                                 f"{trial.cost * 1e3:.3f}", int(trial.abandoned), 0])
            if final:
                chosen = self.search.best_setting
                writer.writerow(["chosen", chosen.reduction, chosen.cap_mb,
                                 min(chosen.first_mb, chosen.cap_mb), int(chosen.solo), "", "",
                                 "" if self.search.best is None else
                                 f"{self.search.best.cost * 1e3:.3f}", "", 1])
        self._logged = len(history)


def make_autotuner(reducer, control, world) -> Autotuner:
    """The autotuner for a wrapper's reducer, starting from the reducer's present setting,
    with the ``HPCDDP_AUTOTUNE_*`` settings.

    .. warning:: Collective (the MPI library's name is read on every rank alike).
    """
    solo_bytes = get_setting("SOLO_BUCKET_KB") << 10
    on_gpu = reducer.params[0].is_cuda
    start = Setting(reducer.transport.reduction.name, reducer.solo_bytes > 0,
                    reducer.cap_bytes / _MIB, reducer.first_cap_bytes / _MIB)
    dense = [p for i, p in enumerate(reducer.params) if i not in reducer.sparse]
    fingerprint = {
        "world size": control.size, "nodes": world.num_nodes,
        "ranks per node": world.local_size, "device": world.device.type,
        "MPI": library_version_line()[:120],
        "cuda-aware": bool(world.cuda_aware),
        "model": [list(p.shape) for p in dense][:4096],
    }
    budget = get_setting("AUTOTUNE_STEPS")
    if budget < 1:
        raise ValueError(f"HPCDDP_AUTOTUNE_STEPS={budget}: the search needs at least one "
                         f"step; give e.g. 64")
    reductions = policy.worth_trying(get_setting("REDUCE"), world.reduction, on_gpu,
                                     world.reduction_facts)
    return Autotuner(reducer, control, reductions, start, solo_bytes, budget, get_setting("AUTOTUNE_LOG"), fingerprint)
