#!/bin/bash
# hpcddp training without Slurm: mpirun/mpiexec on one node or a host list.
#
#   slurm/mpirun.sh                          # 2 ranks on this machine
#   NP=8 HOSTS=node1:4,node2:4 slurm/mpirun.sh --epochs 20
#
# Preemption: send SIGUSR1 to this script (kill -USR1 <pid>); it forwards the signal to
# the launcher, which passes it to the ranks; hpcddp checkpoints at the next step and
# exits. Run the script again to resume from the checkpoint.

NP=${NP:-2}                           # EDIT: number of ranks
HOSTS=${HOSTS:-}                      # EDIT: e.g. node1:4,node2:4 (empty: this machine)
PYTHON=${PYTHON:-python}              # EDIT: the Python that has hpcddp
TRAIN=${TRAIN:-examples/train_digits.py}
MPIEXEC=${MPIEXEC:-mpiexec}           # EDIT: your MPI's launcher (mpiexec or mpirun)

args=(-n "${NP}")
[ -n "${HOSTS}" ] && args+=(-hosts "${HOSTS}")   # MPICH/Hydra; Open MPI: --host
"${MPIEXEC}" "${args[@]}" "${PYTHON}" "${TRAIN}" "$@" &
launcher=$!
trap 'kill -USR1 "${launcher}"' USR1
while true; do
    wait "${launcher}"
    status=$?
    kill -0 "${launcher}" 2>/dev/null || break
done
exit "${status}"
