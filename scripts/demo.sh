#!/usr/bin/env bash
# The main job on embedded defaults: synthetic check-ins shipped as a generator, one city, released
# through the Prefect release flow (a local Prefect server started for the command, a Dask
# LocalCluster, a local file release store). Creates .venv and installs everything on first use.
# Re-running it is a no-op: the same release key returns the committed version.
source "$(dirname "$0")/_env.sh"
DATA=.demo/checkins.parquet
STORE=.demo/store
[ -f "$DATA" ] || geodp synth "$DATA" --city new-york --users 3000 --days 28 --seed 0
# No --public-total: the release pays 10% of ε for a contribution profile, answers full counts from
# it, and its intervals cover the noise and the bias of bounding each person to k points.
geodp release "$DATA" --cities new-york --epsilon 1.0 --mechanism identity --param cell_width_m=250 \
    --max-points-per-user 20 --store "$STORE" "$@"
echo
echo "committed releases in $STORE:"
geodp releases list "$STORE"
echo
echo "example query (a 1 km box in lower Manhattan):"
geodp query "$(geodp releases list "$STORE" --json | python -c "import json,sys; print(json.load(sys.stdin)[-1]['url'])")" \
    --box 40.7080,-74.0120,40.7170,-74.0000
