"""The fault soak's results as the Markdown table of the README and the benchmarks page:
one row per kind of fault, from the runs a results file holds (``bench_faults.py``).

    python benchmarks/soak_table.py [--since COMMIT] results/faults-3x1-multiple-ofi.json [...]

Several files of the same layout, level and MPI (a soak over several sittings, a crawl
soaked apart) are counted together; ``--since`` counts only the runs made at that commit
or one after it (each run names its commit). Standard library and git only."""

import argparse
import json
import statistics
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

NAMES = {"ranks_killed": "every rank of a node killed",
         "node_lost": "node lost with its launcher proxy",
         "link_down": "link down", "crawl": "link at 8 kbit/s",
         "frozen": "node frozen (SIGSTOP)", "stuck": "one rank stuck in user code",
         "slow": "one rank 5x slower"}
HEADER = ("| fault | configuration | runs | hangs | crashes | named | fault to end, median "
          "(max) | left behind | resume identical | log kept |\n"
          "|---|---|---|---|---|---|---|---|---|---|")
# Settings every soak's launcher gets from the testbed, not a choice of the soak's.
_TESTBED = ("UCX_TLS",)


def configuration(run):
    """The MPI settings a run's soak was started with ("defaults": what make demo
    installs, nothing more) and where its launcher wrote (a log file, or a pipe)."""
    settings = [f"{k}={v}" for k, v in sorted(run.get("mpi_settings", {}).items())
                if k not in _TESTBED]
    where = {"file": "log file", "pipe": "pipe"}.get(run.get("output"), "pipe")
    module = f" (MPICH on {run['network_module']})" if run.get("network_module") else ""
    return f"{' '.join(settings) or 'defaults'}{module}, {where}"


def _named(runs):
    named = sum(r["named"] for r in runs)
    # The launcher ended every rank within a second, with no line: none lived to report.
    unspoken = [r for r in runs if not r["named"] and not r["hung"] and r["seconds"] < 1.0]
    if len(unspoken) == len(runs):
        return "none lived to report: the launcher ended every rank at once"
    text = str(named)
    if unspoken:
        text += f" ({len(unspoken)} ended by the launcher at once, none lived to report)"
    return text


def _left(runs):
    ranks = sum(sum(r["ranks_left"].values()) for r in runs)
    counted = [r for r in runs if not r.get("machine_shared")]
    segments = sum(r["shm_segments_left"] for r in counted)
    size = sum(r["shm_bytes_left"] for r in counted)
    parts = []
    if ranks:
        parts.append(f"{ranks} stopped rank{'s' * (ranks > 1)}" if all(
            r["kind"] == "frozen" for r in runs) else f"{ranks} ranks")
    if segments:
        parts.append(f"{segments} segments ({size / 2**20:.0f} MiB)")
    return ", ".join(parts) or "nothing"


def row(kind, runs):
    ends = [r["seconds"] for r in runs if not r["hung"]]
    crashes = sum(r["crashed"] for r in runs)
    healed = sum(bool(r.get("kernel_faults_when_healed")) for r in runs)
    crash_text = str(crashes) + (f" (+{healed} when a stopped rank was healed)" if healed
                                 else "")
    if kind == "slow":
        end = "runs to its end"
    else:
        end = f"{statistics.median(ends):.1f} s ({max(ends):.1f})" if ends else "-"
    kept = [r["log_kept"] for r in runs if "log_kept" in r]
    return (f"| {NAMES.get(kind, kind)} | {configuration(runs[0])} | {len(runs)} "
            f"| {sum(r['hung'] for r in runs)} "
            f"| {crash_text} | {_named(runs)} | {end} | {_left(runs)} "
            f"| {sum(r['identical'] for r in runs)} | {sum(kept) if kept else '-'} |")


def _after(commit, since):
    """Whether ``commit`` (``git describe``'s, ``-dirty`` or not) is ``since`` or after it."""
    if not commit:
        return False
    found = subprocess.run(["git", "merge-base", "--is-ancestor", since,
                            commit.removesuffix("-dirty")], cwd=ROOT)
    return found.returncode == 0


def table(files, since=None):
    runs, held = [], set()
    for path in files:
        data = json.loads(Path(path).read_text())
        held.add((data["layout"], data["level"], data.get("flavour", "mpich")))
        runs += [r for r in data["runs"] if since is None or _after(r.get("commit"), since)]
    if len(held) != 1:
        raise SystemExit(f"these files hold different soaks: {sorted(held)}")
    kinds = [k for k in NAMES if any(r["kind"] == k for r in runs)]
    layout, level, flavour = held.pop()
    launched = sorted({r["launcher_args"] for r in runs if r.get("launcher_args")})
    flavour += "".join(f" ({args})" for args in launched)
    title = f"{layout}, {level}, {flavour}: {len(runs)} runs" + (
        f" since {since}" if since else "")
    configurations = list(dict.fromkeys(configuration(r) for r in runs))
    return "\n".join([title, "", HEADER] + [
        row(k, chosen) for k in kinds for c in configurations
        if (chosen := [r for r in runs if r["kind"] == k and configuration(r) == c])])


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("files", nargs="+", metavar="JSON")
    parser.add_argument("--since", default=None, metavar="COMMIT",
                        help="only the runs made at this commit or after it")
    args = parser.parse_args()
    print(table(args.files, args.since))


if __name__ == "__main__":
    main()
