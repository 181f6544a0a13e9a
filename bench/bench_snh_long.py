"""SNH with its authors' long training, on CPU or a GPU: the accuracy a longer fit buys, and when a GPU pays off.

    nice -n 10 .venv/bin/python bench/bench_snh_long.py --configs default,authors-1000 --epsilons 0.05
    python bench/bench_snh_long.py --runs 0.05:authors-200,0.05:default,0.05:authors-max,0.2:authors-1000 \
        --budget-s 480 --json out.jsonl            # on a GPU: authors-max takes what the budget leaves (≤ 5,000)

The authors' CABS_SFS protocol as in `bench_snh.py cabs` (record level, the public 13 km box around
37.76369,-122.43371, squares of 0.20–0.275% and 0.2–0.8% of the side centred on data points, ψ = 0.1% of n),
fitted through dpcore, the library a release calls (`get_mechanism("snh", **params).fit`), not through the
CLI: a GPU machine holds torch but not the platform's stack. "authors-N" is their configuration
(github szeighami/SNH tests/test_sf_cabs/0/conf.json): a flat grid of ρ ≈ 0.0293 of the side (38 m),
8 query-size nets of 20 hidden layers × 80 units, full-batch Adam (150,000 samples, one step per epoch),
lr 1e-3, their weighted squared loss, labels clipped at 0, answers from the nets, N epochs (their README's
sample output: 0.065 after 5,000). Prints one row per fit with its wall and process CPU seconds; nothing
here asserts.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_snh import CABS_AUTHORS_ERROR, CABS_BANDS_FRACTION, CABS_FILE, SHARED

from dpcore.data.points import load_points
from dpcore.evaluation.metrics import psi_for, relative_error
from dpcore.evaluation.range import region_data
from dpcore.geo import resolve_region
from dpcore.mechanisms import PointsInput, PrivacyUnit, get_mechanism
from dpcore.privacy.noise import NoiseSource
from dpcore.queries.range import square_workload, true_counts

AUTHORS = {"cell_width_m": 38.1, "query_sides_m": [26, 104], "n_sizes": 8, "hidden": 80, "depth": 20,
           "loss": "paper", "batch_size": 150_000, "samples_per_epoch": 150_000, "lr": 1e-3, "answer": "nets"}


def config(name: str) -> dict:
    """Parameters of a named configuration: ``default`` (geodp's), ``authors-N`` (N epochs, no early stop),
    ``smoke`` (the authors' shape, tiny, to check the script)."""
    if name == "default":
        return {}
    if name.startswith("authors-"):
        epochs = int(name.split("-", 1)[1])
        return {**AUTHORS, "max_epochs": epochs, "patience": epochs}
    if name == "smoke":
        return {**AUTHORS, "depth": 2, "hidden": 8, "max_epochs": 2, "patience": 2, "batch_size": 4096,
                "samples_per_epoch": 4096}
    raise SystemExit(f"unknown configuration {name!r}: default, authors-N or smoke")


def cpu_now() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default=None, help=f"CABS_SFS trip starts (.npy lat, lon); default ../shared/data/{CABS_FILE}")
    ap.add_argument("--center", default="37.76369,-122.43371")
    ap.add_argument("--side-km", type=float, default=13.0)
    ap.add_argument("--epsilons", default="0.05")
    ap.add_argument("--configs", default="default,authors-1000")
    ap.add_argument("--runs", default=None,
                    help="ε:config pairs in order (instead of --epsilons × --configs); authors-max trains as many "
                         "epochs (≤ 5,000) as --budget-s leaves after the runs behind it, timed by the last authors fit")
    ap.add_argument("--queries", type=int, default=4000)
    ap.add_argument("--device", default=None, help="torch device for training (default: CUDA when present)")
    ap.add_argument("--seed", type=int, default=1000)
    ap.add_argument("--budget-s", type=float, default=1e9, help="wall seconds for all fits: later ones are skipped")
    ap.add_argument("--json", default=None, help="append each row to this JSON-lines file as it finishes")
    args = ap.parse_args()

    import torch

    latlon = np.load(args.data or SHARED / CABS_FILE)
    region = resolve_region(center=args.center, side_km=args.side_km)
    import pandas as pd

    frame = pd.DataFrame({"user_id": np.arange(latlon.shape[0], dtype=np.int64),
                          "timestamp": pd.Timestamp("2008-06-01", tz="UTC"), "lat": latlon[:, 0], "lon": latlon[:, 1]})
    table = Path(os.environ.get("TMPDIR", "/tmp")) / "bench_snh_long_cabs.parquet"
    frame.to_parquet(table)
    data = region_data(load_points(table).points, region)
    psi = psi_for(data.n_points)
    rng = np.random.default_rng([0, 0xCAB5])  # the same squares as `bench_snh.py cabs`
    workloads = []
    for lo, hi in CABS_BANDS_FRACTION:
        a, b = lo * region.side_m, hi * region.side_m
        boxes = square_workload(region, args.queries, a, b, rng, (data.x, data.y))
        workloads.append(((a, b), boxes, true_counts(data.x, data.y, boxes)))
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    gpu = torch.cuda.get_device_name(0) if device.startswith("cuda") else "-"
    print(f"{data.n_points:,} points in the box; ψ {psi:.1f}; {args.queries} squares per band; device {device} ({gpu}); "
          f"torch {torch.__version__}; {os.cpu_count()} CPUs; authors' figure {CABS_AUTHORS_ERROR} on "
          f"{workloads[0][0][0]:.0f}–{workloads[0][0][1]:.0f} m", flush=True)
    zero = [float(relative_error(np.zeros(t.size), t, psi).mean()) for _, _, t in workloads]
    print("answer 0: " + ", ".join(f"{z:.4f}" for z in zero), flush=True)
    fit_input = PointsInput(data.x, data.y, region, PrivacyUnit.of("record"), user=data.user)
    runs = ([(float(r.split(":")[0]), r.split(":")[1]) for r in args.runs.split(",")] if args.runs else
            [(float(e), c) for e in args.epsilons.split(",") for c in args.configs.split(",")])
    start, per_epoch, overhead = time.perf_counter(), None, 0.0
    for i, (eps, name) in enumerate(runs):
        left = args.budget_s - (time.perf_counter() - start)
        if name == "authors-max":
            if per_epoch is None:
                raise SystemExit("authors-max needs an earlier authors-N run to time an epoch")
            behind = sum(int(n.split("-")[1]) for _, n in runs[i + 1:] if n.split("-")[-1].isdigit())
            epochs = min(5000, int((left - 2 * overhead - 10) / per_epoch) - behind)
            if epochs < 100:
                print(f"skipped ε {eps:g} {name}: {left:.0f} s left", flush=True)
                continue
            name = f"authors-{epochs}"
        elif left <= 0:
            print(f"skipped ε {eps:g} {name}: past the {args.budget_s:g} s budget", flush=True)
            continue
        params = {**config(name), "device": device}
        mech = get_mechanism("snh", **params)
        t0, c0 = time.perf_counter(), cpu_now()
        synopsis = mech.fit(fit_input, eps, NoiseSource.seeded(args.seed))
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        fit_s, fit_cpu = time.perf_counter() - t0, cpu_now() - c0
        trained = [re.search(r"trained (\d+) epochs in ([\d.]+) s", str(n)) for n in synopsis.privacy.notes]
        trained = [m for m in trained if m]
        if name.startswith("authors-") and trained:
            per_epoch = float(trained[0].group(2)) / int(trained[0].group(1))
            overhead = fit_s - float(trained[0].group(2))
        errs = [float(relative_error(synopsis.answer(boxes), truth, psi).mean()) for _, boxes, truth in workloads]
        notes = [n for n in synopsis.privacy.notes if "trained" in str(n)]
        row = {"epsilon": eps, "config": name, "params": params, "errors": errs,
               "bands_m": [list(w[0]) for w in workloads], "fit_wall_s": fit_s, "fit_cpu_s": fit_cpu,
               "device": device, "gpu": gpu, "notes": [str(n) for n in notes], "answer_zero": zero}
        print(f"ε {eps:g} {name:<14} " + "  ".join(f"{e:.4f}" for e in errs)
              + f"   fit {fit_s:.1f} s wall, {fit_cpu:.1f} CPU-s  {' '.join(row['notes'])[:160]}", flush=True)
        if args.json:
            with open(args.json, "a") as fh:
                fh.write(json.dumps(row) + "\n")

if __name__ == "__main__":
    main()
