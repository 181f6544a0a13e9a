"""CPU-seconds of a release's Prefect + Dask form beside its in-process form, on the same input, per
process of the tree (issue 46 item 2: the served form within 1.5× the in-process CPU).

Each run is its own `geodp release run` process: ``--out DIR`` (in-process) or ``--store DIR`` (the
Prefect flow on Dask). CPU is user + system seconds of that process and every process it starts
(resource.getrusage(RUSAGE_CHILDREN) around the run: the whole tree, each child waited for). A sampler
splits it by process (the flow's own process, Prefect's API server (a child, or the event-loop thread that
serves it in the flow's process), Dask worker processes, other children) from /proc every 0.1 s; the split
misses up to 0.1 s per process, the total does not.
Forms, interleaved, median of ``--repeat``:

- ``inproc``: ``--out DIR``.
- ``prefect``: ``--store DIR`` with no PREFECT_API_URL: the command starts its own one-off server.
- ``server``: ``--store DIR`` against a ``prefect server start`` this bench starts once (PREFECT_API_URL
  set, as a served platform has it); the server's own CPU during the run is reported beside the tree's
  (``+srv``), since it works for the run too.

``--trees`` compares checkouts side by side (each first on PYTHONPATH). ``--env K=V`` sets variables
for the forms that run a flow (e.g. GEODP_DASK_PROCESSES=1 to compare worker processes).

    nice -n 10 python bench/bench_served_cost.py --sf-cabs ../shared/data/sf_cabs.parquet \
        [--synth /tmp/geodp-bench-user/synth-u2580000-d30-f30] [--forms inproc,prefect,server] \
        [--repeat 3] [--trees /path/before,/path/after] [--unit user]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
K = 50


def _cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _kind(pid: int, root: int) -> str:
    if pid == root:
        return "flow"
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return "other"
    if "uvicorn" in cmd or "prefect.server" in cmd:
        return "server"
    if "multiprocessing" in cmd and "resource_tracker" not in cmd:
        return "worker"
    return "other"


def _children(pid: int) -> list[int]:
    out = []
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as f:
                out += [int(c) for c in f.read().split()]
    except OSError:
        pass
    return out


def _thread_cpu_s(pid: int, name: str) -> float:
    """CPU-seconds of the threads of ``pid`` the OS names ``name`` (a command's one-off Prefect API thread)."""
    total = 0.0
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/comm") as f:
                if f.read().strip() != name:
                    continue
            with open(f"/proc/{pid}/task/{task}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except OSError:
        pass
    return total


def _sample(root: int, stop: threading.Event, seen: dict[int, tuple[str, float]]) -> None:
    while not stop.is_set():
        todo, tree = [root], []
        while todo:
            pid = todo.pop()
            tree.append(pid)
            todo += _children(pid)
        for pid in tree:
            try:
                used = _cpu_s(pid)
            except OSError:
                continue
            # a child is "other" until it execs (its command line is its parent's before then)
            kind = seen[pid][0] if seen.get(pid, ("other",))[0] != "other" else _kind(pid, root)
            seen[pid] = (kind, max(used, seen.get(pid, ("", 0.0))[1]))
        # the one-off API server on a thread of the flow's process (tasks.runtime.ThreadServer): its event
        # loop's thread, split from the flow's own CPU (its database and worker threads stay the flow's)
        in_thread = _thread_cpu_s(root, "prefect-api")
        if in_thread:
            seen[-1] = ("server", max(in_thread, seen.get(-1, ("", 0.0))[1]))
        time.sleep(0.1)


def run_tree(cmd: list[str], tree: str, env: dict) -> dict:
    """CPU-seconds of ``cmd`` and every process it starts: the total and its split by kind of process."""
    env = {**os.environ, **env, "PYTHONPATH": tree, "OMP_NUM_THREADS": "1", "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    proc = subprocess.Popen(cmd, cwd=tree, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    stop, seen = threading.Event(), {}
    sampler = threading.Thread(target=_sample, args=(proc.pid, stop, seen), daemon=True)
    sampler.start()
    out, err = proc.communicate()
    stop.set()
    sampler.join()
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{err[-3000:]}")
    split: dict[str, float] = {}
    for kind, used in seen.values():
        split[kind] = split.get(kind, 0.0) + used
    if -1 in seen:  # the server's thread is part of the flow's process: count it once
        split["flow"] = split.get("flow", 0.0) - seen[-1][1]
    split["n_workers"] = sum(kind == "worker" for kind, _ in seen.values())
    return {"cpu_s": (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), **split}


def release_cmd(data: str, form: str, unit: str, city: str, period: str) -> list[str]:
    store = tempfile.mkdtemp(prefix="geodp-bench-served-store-")
    return [sys.executable, "-m", "flows.cli", "release", "run", data, "--city", city, "--period", period,
            "--epsilon", "1", "--mechanism", "identity", "--param", "cell_width_m=100", "--privacy-unit", unit,
            "--max-points-per-user", str(K), "--budget-cap", "1000", "--publish-anyway",
            "--out" if form == "inproc" else "--store", store]


class Server:
    """`prefect server start` on a free port with its own PREFECT_HOME, for the ``server`` form."""

    def __init__(self) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.home = tempfile.mkdtemp(prefix="geodp-bench-served-home-")
        self.url = f"http://127.0.0.1:{self.port}/api"
        env = {**os.environ, "PREFECT_HOME": self.home, "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}
        env.pop("PREFECT_API_URL", None)
        self.proc = subprocess.Popen([sys.executable, "-m", "prefect", "server", "start", "--host", "127.0.0.1",
                                      "--port", str(self.port)], env=env, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL, start_new_session=True)
        for _ in range(600):
            try:
                urllib.request.urlopen(f"{self.url}/health", timeout=1)
                return
            except OSError:
                time.sleep(0.2)
        raise SystemExit("prefect server did not start")

    def cpu_s(self) -> float:
        todo, total = [self.proc.pid], 0.0
        while todo:
            pid = todo.pop()
            try:
                total += _cpu_s(pid)
            except OSError:
                continue
            todo += _children(pid)
        return total

    def stop(self) -> None:
        os.killpg(self.proc.pid, signal.SIGTERM)
        self.proc.wait(timeout=60)
        shutil.rmtree(self.home, ignore_errors=True)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sf-cabs", help="the SF cabs Parquet file (San Francisco, 2008-05-18..2008-06-08)")
    ap.add_argument("--synth", help="a `geodp synth` folder (new-york, 2024-01-01..2024-01-30)")
    ap.add_argument("--forms", default="inproc,prefect,server")
    ap.add_argument("--unit", default="user")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--trees", default=str(ROOT))
    ap.add_argument("--env", action="append", default=[], help="K=V for the flow forms")
    args = ap.parse_args()
    env = dict(kv.split("=", 1) for kv in args.env)
    inputs = ([("SF cabs", args.sf_cabs, "san-francisco", "2008-05-18..2008-06-08")] if args.sf_cabs else []) + \
        ([("synthetic", args.synth, "new-york", "2024-01-01..2024-01-30")] if args.synth else [])
    forms, trees = args.forms.split(","), args.trees.split(",")
    server = Server() if "server" in forms else None
    rows: dict[tuple, list[dict]] = {}
    try:
        for _ in range(args.repeat):
            for name, data, city, period in inputs:
                for tree in trees:
                    for form in forms:
                        run_env = {} if form == "inproc" else dict(env)
                        if form == "server":
                            run_env["PREFECT_API_URL"] = server.url
                            srv0 = server.cpu_s()
                        r = run_tree(release_cmd(data, form, args.unit, city, period), tree, run_env)
                        if form == "server":
                            r["srv_s"] = server.cpu_s() - srv0
                        rows.setdefault((name, tree, form), []).append(r)
                        print(json.dumps({"input": name, "tree": tree, "form": form,
                                          **{k: round(v, 2) for k, v in r.items()}}), flush=True)
    finally:
        if server is not None:
            server.stop()
    print(f"\n{args.unit} level, k = {K}; identity at 100 m, ε 1, one city; median of {args.repeat}; CPU-s = "
          "user + system of the whole process tree; the split by process is sampled\n")
    print("| input | tree | form | CPU-s (tree) | × in-process | flow process | server child | workers (n) "
          "| other | external server during the run |")
    print("|---|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for (name, tree, form), got in rows.items():
        med = {k: statistics.median(r.get(k, 0.0) for r in got) for k in
               ("cpu_s", "flow", "server", "worker", "other", "n_workers", "srv_s")}
        base = rows.get((name, tree, "inproc"))
        ratio = f"{med['cpu_s'] / statistics.median(r['cpu_s'] for r in base):.2f}" if base else "–"
        print(f"| {name} | {tree} | {form} | {med['cpu_s']:.2f} | {ratio} | {med['flow']:.2f} | {med['server']:.2f} "
              f"| {med['worker']:.2f} ({med['n_workers']:.0f}) | {med['other']:.2f} "
              f"| {med['srv_s']:.2f} |" if form == "server" else
              f"| {name} | {tree} | {form} | {med['cpu_s']:.2f} | {ratio} | {med['flow']:.2f} | {med['server']:.2f} "
              f"| {med['worker']:.2f} ({med['n_workers']:.0f}) | {med['other']:.2f} | – |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
