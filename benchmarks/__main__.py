"""`make bench`: run every benchmark module in this folder, one process each.

Each `*_bench.py` prints its own figures next to a baseline measured in the same run. Separate
processes keep one benchmark's memory and JIT warm-up from colouring the next.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def main(argv: list[str]) -> int:
    here = Path(__file__).resolve().parent
    wanted = [a for a in argv if not a.startswith("-")]
    flags = [a for a in argv if a.startswith("-")]
    failed = 0
    for path in sorted(here.glob("*_bench.py")):
        name = path.stem
        if wanted and name not in wanted and name.removesuffix("_bench") not in wanted:
            continue
        print(f"\n=== {name} ===", flush=True)
        rc = subprocess.call([sys.executable, "-m", f"benchmarks.{name}", *flags], cwd=here.parent)
        failed += rc != 0
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
