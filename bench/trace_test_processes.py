"""CPU of a command's process tree by kind of process (Dask worker, Prefect server, forked CLI command …):
polls every descendant every 0.3 s and keeps each one's last user + system time, so a process that lives
less than a poll, and a child's time after the last poll, are missed. Used to see where a test's CPU goes
(bench/results/2026-11-29-suite-cpu-4.md):

    .venv/bin/python bench/trace_test_processes.py python -m pytest -q -n 0 tests/test_release_lost_worker.py
"""

from __future__ import annotations

import collections
import subprocess
import sys
import time

import psutil

KINDS = (("uvicorn", "prefect test server"), ("prefect server start", "prefect server start"),
         ("moto_server", "moto"), ("cli_template", "cli template"), ("forkserver", "multiprocessing forkserver"),
         ("spawn_main", "spawned (Dask worker)"), ("resource_tracker", "multiprocessing resource tracker"),
         ("prefect.engine", "prefect flow run"), ("flows.cli serve", "geodp serve"), ("flows.cli", "geodp (fresh)"),
         ("dask worker", "dask worker"), ("dask scheduler", "dask scheduler"), ("pytest", "pytest"))


def kind(cmdline: list[str], parent: str) -> str:
    text = " ".join(cmdline)
    name = next((k for pattern, k in KINDS if pattern in text), text[:60])
    # a child forked from the CLI template has the template's command line
    return "geodp (forked from the template)" if name == "cli template" and parent == "cli template" else name


def main(argv: list[str]) -> int:
    proc = subprocess.Popen(argv)
    root = psutil.Process(proc.pid)
    seen: dict[tuple[int, float], list] = {}
    while proc.poll() is None:
        try:
            procs = [root, *root.children(recursive=True)]
        except psutil.Error:
            procs = []
        for p in procs:
            try:
                t = p.cpu_times()
                key = (p.pid, p.create_time())
                if key not in seen:
                    parent = next((v[0] for (pid, _), v in seen.items() if pid == p.ppid()), "")
                    seen[key] = [kind(p.cmdline(), parent), 0.0]
                seen[key][1] = t.user + t.system
            except psutil.Error:
                pass
        time.sleep(0.3)
    total: dict[str, list] = collections.defaultdict(lambda: [0.0, 0])
    for name, cpu in seen.values():
        total[name][0] += cpu
        total[name][1] += 1
    print("\n| CPU-s | processes | kind |\n|---:|---:|---|")
    for name, (cpu, n) in sorted(total.items(), key=lambda kv: -kv[1][0]):
        print(f"| {cpu:.1f} | {n} | {name} |")
    print(f"| {sum(v[0] for v in total.values()):.1f} | | all |")
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
