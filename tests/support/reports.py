"""The JSON reports that ranks ending a job write where ``HPCDDP_REPORT_DIR`` says
(``hpcddp.faults.report``): the tests assert what a failure means through their fields,
and each message's wording once, in tests/unit/test_report_words.py."""

import json
from pathlib import Path


def read_reports(folder) -> dict:
    """``{rank: report}`` of every report in ``folder``; none there: ``{}``."""
    found = {}
    for path in sorted(Path(folder).glob("hpcddp-report-rank*.json")):
        report = json.loads(path.read_text())
        found[report["rank"]] = report
    return found


def read_recoveries(folder) -> dict:
    """``{rank: [recovery, ...]}`` of every recovery report in ``folder``
    (``hpcddp.elastic``'s, named by the rank after the recovery)."""
    found = {}
    for path in sorted(Path(folder).glob("hpcddp-recovery-rank*.json")):
        report = json.loads(path.read_text())
        found[report["rank"]] = report["recoveries"]
    return found


def the_report(folder, kind, output=""):
    """The report of ``kind`` written by the lowest rank that wrote one (several ranks
    can time out at once; the lowest one's verdict is the one the job shows first).
    Fails, showing ``output``'s end, where there is none."""
    reports = {rank: r for rank, r in read_reports(folder).items() if r["kind"] == kind}
    assert reports, f"no {kind!r} report in {folder}:\n{output[-3000:]}"
    return reports[min(reports)]


def reports_said(folder) -> str:
    """Every report in ``folder`` in a line each, for a failing assertion's message: who
    wrote it, when, of what kind, in which wait, and how it saw the ranks it names."""
    lines = []
    for path in sorted(Path(folder).glob("hpcddp-report-rank*.json")):
        report = json.loads(path.read_text())
        states = {rank: state["state"] for rank, state in report.get("ranks", {}).items()}
        lines.append(f"rank {report['rank']} on {report['host']} at "
                     f"{path.stat().st_mtime:.1f}: {report['kind']} "
                     f"{report.get('reason', report.get('exception', ''))}; wait "
                     f"{report.get('wait', {}).get('what')}; not arrived {states}; silent "
                     f"{report.get('silent_nodes')}")
    return "\n".join(lines) or f"no report in {folder}"
