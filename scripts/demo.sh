#!/usr/bin/env bash
# The main job on embedded defaults: synthetic check-ins shipped as a generator, one city, a local
# release folder. Creates .venv and installs everything on first use.
source "$(dirname "$0")/_env.sh"
DATA=.demo/checkins.parquet
OUT=.demo/releases/new-york-$(date -u +%Y%m%dT%H%M%S)
[ -f "$DATA" ] || geodp synth "$DATA" --city new-york --users 3000 --days 28 --seed 0
geodp release "$DATA" --city new-york --epsilon 1.0 --mechanism identity --param cell_width_m=250 \
    --max-points-per-user 20 --out "$OUT" "$@"
echo
echo "example query (a 1 km box in lower Manhattan):"
geodp query "$OUT" --box 40.7080,-74.0120,40.7170,-74.0000
