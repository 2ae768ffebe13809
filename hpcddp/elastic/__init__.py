"""Elastic training's structure: training state committed in memory, restored, synced,
and a loop that re-enters from the last commit (``State``, ``run``).

    state = hpcddp.elastic.State(model, optimizer, loader=loader, step=0, epoch=0,
                                 checkpoint="ckpt", checkpoint_every=4)

    @hpcddp.elastic.run
    def train(state):
        while state.step < steps:
            ...                       # one step, state.step += 1
            if state.step % 10 == 0:
                state.commit()

    train(state)

On every MPI, ``run`` starts from the newest checkpoint in ``checkpoint`` where there is
one (the batch script's successor job), else from the lowest rank's state (``sync``),
and ``commit()`` writes a checkpoint every ``checkpoint_every`` commits. Under ULFM
(Open MPI's ``mpirun --with-ft ulfm``) a rank that dies costs a recovery inside the job:
the survivors shrink it, rebuild hpcddp on themselves and go on from the newest commit
(``hpcddp.elastic.recovery``). Elsewhere a lost rank ends the job as everywhere in
hpcddp, and the next job resumes from the checkpoint.
"""

import hpcddp.runtime  # noqa: F401 - first: MPI starts there, as hpcddp starts it
from hpcddp.elastic.state import State, run

__all__ = ["State", "run"]
