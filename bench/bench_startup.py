"""Start-up cost of the `geodp` CLI: CPU-seconds of the whole process tree per command, median of N runs,
interleaved (each round runs every command once), plus which heavy modules each command imported.

    .venv/bin/python bench/bench_startup.py [--runs 3] [--tree PATH ...] [--importtime]

Each command is ``python -m flows.cli ARGS`` in a process of its own, as a user runs it, with PYTHONPATH
set to a ``--tree`` (default: this repository); with several trees (e.g. a checkout of the commit
before, made with ``git archive COMMIT | tar -x -C DIR``) every round runs each command in each tree. CPU is
user + system time of the command and every process it started and waited for (RUSAGE_CHILDREN). Each tree's
packages are byte-compiled first (``compileall``, into their ignored __pycache__ folders), as an installed
geodp is: with PYTHONDONTWRITEBYTECODE set (as in the development shell) a fresh checkout otherwise compiles
its ~80 modules on every run, 0.12-0.15 CPU-s of a release; ``--no-compile`` measures that way. The
input is 1,000 synthetic check-ins (seeded) in one CSV; `release run --publish-anyway` writes into a fresh --out DIR each
time (a re-run would be a no-op). ``--importtime`` prints, per command, the 15 largest top-level entries
of ``python -X importtime`` (cumulative microseconds, inflated by the measurement itself).
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: The profile's verdict refuses this small release (expected worse than a blank map); the bench
#: measures the whole release, so it publishes anyway.
ANYWAY = ["--publish-anyway"]
#: Modules a command may pull in without needing them; the table says which ones each command loaded.
#: The project's packages, byte-compiled in each tree before it is measured.
PACKAGES = ("dpcore", "tasks", "flows", "geodp")
HEAVY = ("dask", "dask.dataframe", "distributed", "matplotlib", "prefect", "torch", "scipy", "pandas", "pyarrow",
         "sklearn", "pydantic", "fsspec")


def _points(path: Path) -> None:
    sys.path.insert(0, str(ROOT))
    from dpcore.data.synthetic import generate_checkins
    from dpcore.geo import city_region

    generate_checkins(city_region("new-york"), n_users=100, days=7, seed=3).head(1000).to_csv(path, index=False)


def _run(tree: str, args: list[str], env_extra: dict | None = None) -> tuple[float, str]:
    """(CPU-seconds of the command's process tree, its stderr)."""
    env = {**os.environ, "PYTHONPATH": tree, "PREFECT_SERVER_ANALYTICS_ENABLED": "false", **(env_extra or {})}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    proc = subprocess.run([sys.executable, *args], capture_output=True, text=True, env=env, cwd=tree)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(args)} failed ({proc.returncode}): {proc.stderr[-2000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return cpu, proc.stderr


def _loaded(tree: str, args: list[str]) -> list[str]:
    """The HEAVY modules the command had imported when it finished (-X importtime names each import)."""
    _, err = _run(tree, ["-X", "importtime", *args])
    names = set(re.findall(r"^import time:\s+\d+ \|\s+\d+ \| *(\S+)$", err, flags=re.M))
    return [h for h in HEAVY if h in names]


def _top(tree: str, args: list[str], n: int = 15) -> list[str]:
    _, err = _run(tree, ["-X", "importtime", *args])
    rows = re.findall(r"^import time:\s+\d+ \|\s+(\d+) \|( *)(\S+)$", err, flags=re.M)
    top = sorted(((int(c), name) for c, ind, name in rows if len(ind) <= 1), reverse=True)[:n]
    return [f"{c / 1e6:6.3f} s  {name}" for c, name in top]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--tree", nargs="+", default=[str(ROOT)], help="checkouts whose CLI runs (their PYTHONPATH)")
    ap.add_argument("--importtime", action="store_true")
    ap.add_argument("--no-compile", action="store_true", help="leave the trees without byte-compiled modules")
    a = ap.parse_args()
    trees = [str(Path(t).resolve()) for t in a.tree]
    if not a.no_compile:
        for t in trees:
            subprocess.run([sys.executable, "-m", "compileall", "-q", *(p for p in PACKAGES if (Path(t) / p).is_dir())],
                           cwd=t, check=True, capture_output=True)
    with tempfile.TemporaryDirectory(prefix="geodp-startup-") as tmp:
        tmp = Path(tmp)
        data = tmp / "pts1k.csv"
        _points(data)
        first = tmp / "first"
        _run(trees[0], ["-m", "flows.cli", "release", "run", str(data), "--city", "new-york", "--epsilon", "1",
                        *ANYWAY, "--out", str(first)])
        (release,) = first.glob("releases/*/new-york/all/v1")
        counter = iter(range(10**6))

        def release_run() -> list[str]:
            return ["-m", "flows.cli", "release", "run", str(data), "--city", "new-york", "--epsilon", "1",
                    *ANYWAY, "--out", str(tmp / f"out{next(counter)}")]

        commands = {
            "release run (1,000 points, --out DIR)": release_run,
            "query range (one --box)": lambda: ["-m", "flows.cli", "query", "range", str(release), "--box",
                                                "40.70,-74.02,40.72,-74.00"],
            "release list": lambda: ["-m", "flows.cli", "release", "list", str(first)],
            "--help": lambda: ["-m", "flows.cli", "--help"],
            "python -c pass (floor)": lambda: ["-c", "pass"],
        }
        cpu: dict[tuple[str, str], list[float]] = {(t, name): [] for t in trees for name in commands}
        for _ in range(a.runs):
            for name, args in commands.items():
                for t in trees:
                    cpu[t, name].append(_run(t, args())[0])
        print(f"median of {a.runs} interleaved runs, CPU-s of the process tree")
        for t in trees:
            print(f"\ntree {t}")
            print(f"{'command':<40} {'CPU-s':>6}   runs                 heavy modules imported")
            for name, args in commands.items():
                runs = " ".join(f"{c:.2f}" for c in cpu[t, name])
                print(f"{name:<40} {statistics.median(cpu[t, name]):6.2f}   {runs:<20} "
                      f"{', '.join(_loaded(t, args()))}")
            if a.importtime:
                for name, args in commands.items():
                    print(f"\n-X importtime, {name}: largest top-level imports (cumulative)")
                    print("\n".join(_top(t, args())))


if __name__ == "__main__":
    main()
