"""Per-module and per-test CPU-seconds of a suite run made with GEODP_TEST_CPU_LOG=DIR (tests/conftest.py):
    GEODP_TEST_CPU_LOG=/tmp/cpu ./scripts/test.sh && python scripts/test_cpu.py /tmp/cpu
Each test's figure is its process tree's CPU from setup to teardown (session fixtures land on the first test
that uses them); the total is the sum over tests, the same as the workers' own CPU less collection."""

from __future__ import annotations

import json
import sys
from collections import defaultdict
from pathlib import Path


def main(log: str, top: int = 25) -> None:
    rows = [json.loads(line) for f in sorted(Path(log).glob("*.jsonl")) for line in f.read_text().splitlines()]
    per_module: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0])
    for r in rows:
        m = per_module[r["test"].split("::")[0]]
        m[0] += r["cpu_s"]
        m[1] += r["wall_s"]
        m[2] += 1
    total = sum(r["cpu_s"] for r in rows)
    print(f"{len(rows)} tests, {total:.0f} CPU-s\n\n| module | tests | CPU-s | wall-s |\n|---|---:|---:|---:|")
    for name, (cpu, wall, n) in sorted(per_module.items(), key=lambda kv: -kv[1][0]):
        print(f"| {name} | {n} | {cpu:.1f} | {wall:.1f} |")
    print(f"\nslowest {top} tests by CPU:\n")
    for r in sorted(rows, key=lambda r: -r["cpu_s"])[:top]:
        print(f"{r['cpu_s']:8.1f} {r['wall_s']:8.1f}  {r['test']}")


if __name__ == "__main__":
    main(sys.argv[1], *(int(a) for a in sys.argv[2:3]))
