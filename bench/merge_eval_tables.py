"""Merge `geodp eval range --json` (or `geodp evaluate --json`) reports of one dataset and setting into one markdown table with the goals.

Each argument is a report file, optionally followed by ``:OLD=NEW[,OLD=NEW]`` to rename mechanisms (two
runs of ``ug`` with different parameters). The references (answer 0, hindsight grid) are taken from the
first report; every report of one setting draws the same queries and the same hindsight noise (both
derive from the seed only), so they agree.

    .venv/bin/python bench/merge_eval_tables.py base.json rule.json:ug=ug-data,auto=auto --title "NYC record"

Per cell: each mechanism's mean relative error, the hindsight grid (its m), `auto`'s ratio to the
hindsight grid and to the best mechanism, and whether the issue's goal holds there (auto ≤ 0.8× the
hindsight grid on 25–100 m and 100–1000 m, ≤ 1.0× on 1–5 km, and within 5% of the best mechanism).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

GOAL = {(25.0, 100.0): 0.8, (100.0, 1000.0): 0.8, (1000.0, 5000.0): 1.0}


def load(arg: str) -> tuple[dict, dict[str, str]]:
    path, _, renames = arg.partition(":")
    ren = dict(r.split("=", 1) for r in renames.split(",") if r) if renames else {}
    return json.loads(Path(path).read_text()), ren


def merge(args: list[str]) -> tuple[list[str], dict, dict]:
    order: list[str] = []
    cells: dict[tuple[float, tuple[float, float]], dict[str, float]] = {}
    first = None
    for arg in args:
        rep, ren = load(arg)
        first = first or rep
        for r in rep["results"]:
            name = ren.get(r["mechanism"], r["mechanism"])
            if name not in order:
                order.append(name)
            cells.setdefault((r["epsilon"], tuple(r["query_sides_m"])), {})[name] = r["mean_relative_error"]
    return order, cells, first


def table(args: list[str]) -> str:
    order, cells, ref = merge(args)
    zero = {tuple(z["query_sides_m"]): z["mean_relative_error"] for z in ref["reference_answer_zero"]}
    grid = {(g["epsilon"], tuple(g["query_sides_m"])): g for g in ref["reference_hindsight_grid"]}
    head = ["ε", "band (m)", *order, "answer 0", "hindsight (m)", "auto ÷ hindsight", "auto ÷ best", "goal"]
    rows = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    met = 0
    for (eps, band), errs in sorted(cells.items()):
        g = grid[(eps, band)]
        dp = {m: e for m, e in errs.items()}
        best_name = min(dp, key=dp.get)
        best = dp[best_name]
        auto = dp.get("auto")
        r_grid = auto / g["mean_relative_error"] if auto is not None else None
        r_best = auto / best if auto is not None else None
        ok = auto is not None and r_grid <= GOAL.get(band, 1.0) and r_best <= 1.05
        met += ok
        vals = [f"**{dp[m]:.3f}**" if m == best_name else (f"{dp[m]:.3f}" if m in dp else "-") for m in order]
        rows.append("| " + " | ".join([f"{eps:g}", f"{band[0]:g}–{band[1]:g}", *vals, f"{zero[band]:.3f}",
                                        f"{g['mean_relative_error']:.3f} ({g['grid_size']})",
                                        "-" if r_grid is None else f"×{r_grid:.2f}",
                                        "-" if r_best is None else f"×{r_best:.2f}", "met" if ok else "not met"]) + " |")
    return "\n".join(rows) + f"\n\nGoal met in {met} of {len(cells)} cells (bold: the best DP mechanism)."


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("reports", nargs="+")
    ap.add_argument("--title", default=None)
    args = ap.parse_args(argv)
    if args.title:
        print(f"#### {args.title}\n")
    print(table(args.reports))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
