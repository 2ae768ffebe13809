"""Run torch's suite on gloo and on hpcddp at N ranks and write both outcomes.

    python tests/torch_suite/compare.py N OUT.json [--only REGEX]
"""

import argparse
import json
import re
import time
from pathlib import Path

import driver  # its own folder, the script's, is first on sys.path


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("ranks", type=int)
    parser.add_argument("out")
    parser.add_argument("--only", default="")
    args = parser.parse_args()
    tests = [t for t in driver.names() if re.search(args.only, t)]
    found = {"ranks": args.ranks, "tests": len(tests)}
    for backend in ("gloo", "hpcddp"):
        began = time.monotonic()
        found[backend] = driver.run(args.ranks, backend, tests)
        found[f"{backend}_seconds"] = round(time.monotonic() - began, 1)
    Path(args.out).write_text(json.dumps(found, indent=1))


if __name__ == "__main__":
    main()
