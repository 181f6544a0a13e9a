"""`geodp release run|backfill|list|show`: make releases into a release store and read what it holds.

`release run` has two forms that go through the same pipeline, ledger and exactly-once commit: with
`--store URL` (or several `--cities`) it is the Prefect `release` flow, one Dask task per city; with
`--out DIR` (or `--no-prefect`) the same steps run in this process, into DIR as a local release store."""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Annotated

import typer

from dpcore.privacy.accounting import budget_label
from flows.cli.common import (
    CLIError,
    emit_json,
    eprint,
    field_default,
    loading,
    model_option,
    noun,
    params_by_mechanism,
    validated,
    working,
)
from flows.cli.inputs import (
    Center,
    Columns,
    ConfigFile,
    Data,
    Format,
    Json,
    Params,
    PrivacyUnit,
    Release,
    SideKm,
    Store,
    Strict,
    check_input_options,
    fetch_release,
)
from tasks.config import BackfillParams, ReleaseParams

if TYPE_CHECKING:
    from flows.release_summary import RunSummary

app = noun("release", "Make DP releases into a release store; list and show committed ones.", default="run")

R = ReleaseParams
Cities = Annotated[str | None, typer.Option("--cities", help="catalog city slugs, comma-separated (one Dask "
                                                              "task each in the Prefect form)")]
OneCity = Annotated[str | None, typer.Option("--city", help="one catalog city slug (see `geodp cities`)")]
Epsilon = Annotated[float | None, typer.Option("--epsilon", help=R.model_fields["epsilon"].description)]
Rho = Annotated[float | None, typer.Option("--rho", help=R.model_fields["rho"].description +
                                           " (mechanisms that support it, into a dataset accounted in ρ)")]
K = Annotated[str | None, typer.Option("--max-points-per-user", metavar="K|auto",
                                       help=R.model_fields["max_points_per_user"].description)]


def _k(text: str | None) -> int | str | None:
    """--max-points-per-user: a whole number or auto."""
    if text is None or text.strip().lower() == "auto":
        return None if text is None else "auto"
    try:
        return int(text)
    except ValueError:
        raise CLIError(f"--max-points-per-user must be a whole number or auto, got {text!r}") from None
Count = Annotated[str, typer.Option("--count", metavar="points|people", help=R.model_fields["count"].description)]
PublishAnyway = Annotated[bool, typer.Option("--publish-anyway", help=R.model_fields["publish_anyway"].description)]


def _release_params(data: str, cities: str | None, city: str | None, center: str | None, out: str | None,
                    store: str | None, period: str | None, epsilon: float | None, rho: float | None,
                    mechanism: str, param: list[str] | None, **rest) -> ReleaseParams:
    if sum(v is not None for v in (cities, city, center)) != 1:
        raise CLIError("give exactly one of --cities A,B, --city NAME or --center LAT,LON")
    if (store is None) == (out is None):
        raise CLIError("give exactly one of --store URL and --out DIR")
    check_input_options(rest["format"], rest["privacy_unit"])
    mech_params = params_by_mechanism(param, [mechanism]).get(mechanism, {})
    return validated(lambda: ReleaseParams(
        data=str(data), cities=cities if cities is not None else (city or ""), period=period, epsilon=epsilon,
        rho=rho, mechanism=mechanism, mechanism_params=mech_params, store=str(store or out), center=center,
        **rest), "release parameters")


def _check_settings(config: str | None) -> None:
    """A bad config file is a one-line error before anything runs."""
    from tasks.settings import load_settings

    load_settings(config)


def _release_options(
    data: Data,
    cities: Cities = None,
    city: OneCity = None,
    center: Center = None,
    side_km: SideKm = None,
    period: str | None = model_option(R, "period", "--period", metavar="P"),
    epsilon: Epsilon = None,
    rho: Rho = None,
    mechanism: str = model_option(R, "mechanism", "--mechanism",
                                  help="mechanism name (see README: which mechanism to use when), or auto"),
    param: Params = None,
    privacy_unit: PrivacyUnit = field_default(R, "privacy_unit"),
    max_points_per_user: K = None,
    data_version: str | None = model_option(R, "data_version", "--data-version"),
    public_total: float | None = model_option(R, "public_total", "--public-total"),
    seed: int | None = model_option(R, "seed", "--seed"),
    store: str | None = typer.Option(None, "--store", help="release store URL: a folder, file:///path or "
                                     "s3://bucket/prefix (the Prefect form)"),
    out: str | None = typer.Option(None, "--out", metavar="DIR",
                                   help="a local folder used as the release store (runs in this process)"),
    dataset: str | None = model_option(R, "dataset", "--dataset"),
    budget_cap: float | None = model_option(R, "budget_cap", "--budget-cap"),
    config: ConfigFile = None,
    dask_address: str | None = model_option(R, "dask_address", "--dask-address"),
    workers: int = model_option(R, "n_workers", "--workers"),
    slot: str = model_option(R, "slot", "--slot"),
    columns: Columns = None,
    format: Format = "auto",
    strict: Strict = False,
    no_prefect: bool = typer.Option(False, "--no-prefect", help="run in this process without Prefect or Dask "
                                    "(what --out does)"),
    count: Count = "points",
    publish_anyway: PublishAnyway = False,
    json_out: Json = None,
) -> None:
    """The options `release run` and `release plan` share (typer reads them from this signature)."""


def _release_command(body: Callable[[dict], int]) -> Callable[..., int]:
    """A typer command with the options of :func:`_release_options` whose body gets them as one dict."""
    @functools.wraps(_release_options)
    def command(**options) -> int:
        return body(options)

    command.__name__, command.__doc__ = body.__name__, body.__doc__
    return command


def _params_of(options: dict) -> ReleaseParams:
    o = dict(options)
    return _release_params(
        o.pop("data"), o.pop("cities"), o.pop("city"), o.pop("center"), o.pop("out"), o.pop("store"),
        o.pop("period"), o.pop("epsilon"), o.pop("rho"), o.pop("mechanism"), o.pop("param"),
        side_km=o["side_km"], privacy_unit=o["privacy_unit"], max_points_per_user=_k(o["max_points_per_user"]),
        data_version=o["data_version"], public_total=o["public_total"], seed=o["seed"], dataset=o["dataset"],
        budget_cap=o["budget_cap"], dask_address=o["dask_address"], n_workers=o["workers"], slot=o["slot"],
        columns=o["columns"], format=o["format"], strict=o["strict"], publish_anyway=o["publish_anyway"],
        count=o["count"])


def run(options: dict) -> int:
    """Release one period of DATA for one or more regions (a manifest, noisy files and a ledger charge)."""
    with loading():  # the modules the work needs (the mechanisms' too, through the parameters' checks)
        params = _params_of(options)
        import tasks.settings  # noqa: F401
        from flows.release import release_cities
        from flows.release_summary import RunSummary
    config, json_out = options["config"], options["json_out"]
    _check_settings(config)
    if options["store"] is not None and not options["no_prefect"]:
        summary = _run_flow(params, config)
    else:
        summary = RunSummary.from_dict(release_cities(params, config, in_process=True, strict=params.strict))
    if json_out is not None:
        emit_json(summary.to_dict(), json_out)
        if json_out == "-":
            return 0
    _print_summary(summary)
    return 0


def plan(options: dict) -> int:
    """What `release run` with the same options would do, from public inputs only (nothing is read from the
    data, nothing charged): each city's expected error per band, predicted from the newest published
    release of its region and the contribution profile an earlier run of the same release paid, else what
    the profile would cost; exit 2 with one line when the run would be refused."""
    from tasks.release_plan import plan_release
    from tasks.release_usefulness import expectation, paid_profile_of
    from tasks.storage.store import dry_run

    params = _params_of(options)
    config, json_out = options["config"], options["json_out"]
    _check_settings(config)
    with dry_run():  # every store and ledger opened here reads only: a plan writes nothing
        planned = plan_release(params, config, check_useful=False)
        st = planned.store
        # a release an earlier run paid the profile of is predicted from that profile (public, recorded)
        rows = [{"city": p.city, **expectation(st, p, paid_profile_of(st, p))} for p in planned.todo]
    if planned.k_choice is not None:
        rows = [{**r, "k_choice": planned.k_choice} for r in rows]
    if json_out is not None:
        emit_json(rows, json_out)
    else:
        if planned.k_choice is not None:
            print(planned.k_choice["statement"])
        for p in planned.plans:
            if p not in planned.todo:
                print(f"{p.city} {planned.period.label}: already committed (a run is a no-op)")
        for r in rows:
            print(f"{r['city']} {planned.period.label}: {r['statement']}")
            if r.get("basis"):
                print(f"  predicted from {r['basis']}")
            for b in r["bands"]:
                lo, hi = b["query_sides_m"]
                if b["typical_count"] is None:
                    most = b.get("typical_count_at_most")
                    print(f"  squares of {lo:g}–{hi:g} m: expected |error| {b['expected_abs_error']:.3g}; the typical "
                          "count is unknown (no published map shows it above its noise)" + (
                              "" if most is None else f" (at most {most:.3g}" + (
                                  ": hopeless even so)" if b["hopeless"] else ")")) + (
                              f" (no verdict: {b['verdict_open']})" if b.get("verdict_open") else
                              "" if b["hopeless"] else " (no verdict)"))
                    continue
                verdict = (f"no verdict: {b['verdict_open']}" if b.get("verdict_open") else
                           "worse than a blank map" if b["worse_than_blank_map"] else "informative")
                print(f"  squares of {lo:g}–{hi:g} m: expected |error| {b['expected_abs_error']:.3g} vs a typical "
                      f"count {b['typical_count']:.3g} ({verdict})")
    bad = [r for r in rows if r.get("useless")]
    if bad and not params.publish_anyway:
        r = bad[0]
        raise CLIError(f"{r['city']}: a release would be refused: expected worse than a blank map at every band; "
                       f"would help: {', '.join(r.get('would_help') or []) or 'nothing tried here'}")
    return 0


app.command("run")(_release_command(run))
app.command("plan")(_release_command(plan))


def _run_flow(params: ReleaseParams, config: str | None) -> RunSummary:
    from flows.release import run_release
    from flows.release_summary import RunSummary
    from tasks.release_plan import plan_release
    from tasks.runtime import local_prefect

    plan = plan_release(params, config)  # a refusal (budget, policy, input) is one line before Prefect starts
    with local_prefect(), working(f"release flow: {len(params.cities) or 1} region(s) on Dask"):
        summary = RunSummary.from_dict(run_release(params, config, plan))
    store = plan.store
    for r in summary.releases:
        found = [m.region for m in store.list_releases(summary.dataset, r.city, summary.period)
                 if m.version == int(r.version)]
        if not found:
            raise CLIError(f"{r.city}: the flow reported v{r.version} but {store.url} holds no such "
                           "committed version; re-run the release")
        r.region = found[0]
    return summary


def _print_summary(summary: RunSummary) -> None:
    from flows.release_summary import loss_line

    for r in summary.releases:
        word = "release written to" if r.status == "committed" else "already committed (no-op):"
        chose = f" ({r.mechanism} chose {r.chosen_mechanism})" if r.chosen_mechanism else ""
        print(f"{r.city} {summary.period} v{r.version}: {word} {r.url}{chose}")
        for note in r.slot_warnings:
            print(f"  warning: {note}")
        if r.k_choice and r.status == "committed":
            print(f"  {r.k_choice['statement']}")
        if r.no_verdict and r.status == "committed":
            print(f"  plan: {r.no_verdict}")
        if r.verdict:
            print(f"  {r.verdict}")
    for refusal in summary.refused:
        eprint(f"refused: {refusal['reason']}")
    print(f"dataset {summary.dataset}: {summary.guarantee}")
    if summary.loss is not None:
        print(f"  {loss_line(summary.policy, summary.loss)}")
    r = summary.releases[0]
    clat, clon = r.region["center_lat"], r.region["center_lon"]
    print("query it with:\n  geodp query " + r.url +
          f" --box {clat - 0.005:.4f},{clon - 0.005:.4f},{clat + 0.005:.4f},{clon + 0.005:.4f}")


def _days(period: str | None, start: str | None, end: str | None) -> tuple[str, str]:
    """First and last UTC day of a backfill, from --period A..B (or a month) or the older --start/--end."""
    from tasks.config import ConfigError, period_days

    if period is not None:
        if start is not None or end is not None:
            raise CLIError("give --period A..B or --start/--end, not both")
        try:
            return period_days(period, "--period of a backfill")
        except ConfigError as exc:
            raise CLIError(str(exc)) from exc
    if start is None or end is None:
        raise CLIError("a backfill needs --period FIRST..LAST (UTC days)")
    eprint("note: --start/--end is the older form; write --period FIRST..LAST")
    return start, end


@app.command("backfill")
def backfill(
    data: Data,
    cities: str = typer.Option(..., "--cities", help="catalog city slugs, comma-separated"),
    period: str | None = typer.Option(None, "--period", metavar="FIRST..LAST",
                                      help="UTC days to release, one release per day (inclusive)"),
    start: str | None = typer.Option(None, "--start", hidden=True),
    end: str | None = typer.Option(None, "--end", hidden=True),
    side_km: SideKm = None,
    epsilon: float = typer.Option(..., "--epsilon", help="ε per city and day"),
    mechanism: str = model_option(R, "mechanism", "--mechanism", help="mechanism name"),
    param: Params = None,
    privacy_unit: PrivacyUnit = field_default(R, "privacy_unit"),
    max_points_per_user: K = None,
    seed: int | None = model_option(R, "seed", "--seed"),
    store: str | None = typer.Option(None, "--store", help="release store URL (default: the configured one; "
                                     "a served deployment uses its own configuration's)"),
    dataset: str | None = model_option(R, "dataset", "--dataset"),
    budget_cap: float | None = model_option(R, "budget_cap", "--budget-cap"),
    config: ConfigFile = None,
    dask_address: str | None = model_option(R, "dask_address", "--dask-address"),
    workers: int = model_option(R, "n_workers", "--workers"),
    slot: str = model_option(R, "slot", "--slot"),
    columns: Columns = None,
    format: Format = "auto",
    deployment: str | None = typer.Option(None, "--deployment", metavar="NAME",
                                          help="submit to this served deployment instead of running here: "
                                               "backfill/backfill runs every day on one Dask cluster, "
                                               "release/release one run per day"),
    publish_anyway: PublishAnyway = False,
    json_out: Json = None,
) -> int:
    """One release per UTC day over a range of days; days already committed are skipped."""
    from tasks.config import days_between

    first, last = _days(period, start, end)
    days = days_between(first, last)
    if not deployment:  # a served deployment uses the config its serving process was started with
        _check_settings(config)
        if store is None:
            from tasks.settings import load_settings

            store = load_settings(config).release_store(None)
    params = _release_params(
        data, cities, None, None, None, store or "configured", None, epsilon, None, mechanism, param,
        side_km=side_km, privacy_unit=privacy_unit, max_points_per_user=_k(max_points_per_user), seed=seed,
        dataset=dataset, budget_cap=budget_cap, dask_address=dask_address, n_workers=workers, slot=slot,
        columns=columns, format=format, publish_anyway=publish_anyway)
    if store is None:  # served: the store of the serving process's configuration
        params = params.model_copy(update={"store": None})
    if deployment:  # the serving process has its own working directory: send absolute local paths
        from tasks.release_request import release_request

        # the request's own checks, before anything is submitted (the store is the serving side's; the
        # input is listed here when this process can: a local path or S3)
        release_request(params.model_copy(update={"period": f"{first}..{last}"}),
                        listed="://" not in params.data or params.data.startswith("s3"))
        return _submit(params, first, last, deployment, json_out)
    from flows.backfill import run_backfill
    from tasks.release_plan import plan_days
    from tasks.runtime import local_prefect

    # every day planned from one request, with one store and ledger, before Prefect starts (a refusal is
    # one line here); the flow run takes these plans
    plans = plan_days(params, first, last, config)
    eprint(f"backfill of {len(days)} day(s) × {len(params.cities)} cities through Prefect")
    with local_prefect(), working(f"backfill flow: {len(days)} day(s)"):
        summary = run_backfill(BackfillParams(release=params, start=first, end=last), config, plans)
    if json_out is not None:
        emit_json(summary, json_out)
        if json_out == "-":
            return 0
    for day in summary["periods"]:
        states = ", ".join([f"{r['city']} v{r['version']} {r['status']}" for r in day["releases"]]
                           + [f"{r['city']} refused" for r in day["refused"]])
        print(f"{day['period']}: {states}")
        for r in day["releases"]:
            if r.get("verdict") and r["status"] == "committed":
                print(f"  {r['city']}: {r['verdict']}")
    print(f"committed {summary['committed']} new version(s); {summary['skipped']} already committed")
    refused = summary.get("refused", [])
    for city in sorted({r["city"] for r in refused}):
        days = [r["period"] for r in refused if r["city"] == city]
        reason = next(r["reason"] for r in refused if r["city"] == city)
        eprint(f"refused: {city} on {len(days)} day(s) ({', '.join(days)}): {reason}")
    if refused and not summary["committed"] and not summary["skipped"]:
        raise CLIError(f"every city of every day was refused ({len(refused)} release(s)); see the lines above")
    return 0


def _submit(params: ReleaseParams, first: str, last: str, deployment: str, json_out: str | None) -> int:
    """`backfill --deployment`: submit, print each run (a run submitted before with the same parameters is
    said to be one, with its state's message), and exit 2 in one line when such a run had failed."""
    from flows.backfill import submit_to_deployment
    from tasks.release_city_plan import public_locator

    params = params.model_copy(update={"data": public_locator(params.data),
                                       "store": public_locator(params.store) if params.store else None})
    runs = submit_to_deployment(BackfillParams(release=params, start=first, end=last), deployment)
    if json_out is not None:
        emit_json(runs, json_out)
    else:
        for r in runs:
            again = "submitted before with the same parameters: " if r["resubmitted"] else ""
            note = f": {r['message']}" if r["message"] and r["failed"] else ""
            print(f"{r['period']}: flow run {r['flow_run_id']} ({again}{r['state']}{note})")
    stale = [r for r in runs if r["resubmitted"] and r["failed"]]
    if stale:
        raise CLIError(f"{len(stale)} run(s) of this backfill were submitted before with the same parameters and "
                       f"failed ({stale[0]['period']}: {stale[0]['message'] or stale[0]['state']}); a re-submission "
                       "returns those runs: change a parameter (e.g. --publish-anyway, --epsilon) to run it again")
    return 0


@app.command("list")
def list_releases(
    store: Store,
    dataset: str | None = typer.Option(None, "--dataset", help="only this dataset"),
    city: str | None = typer.Option(None, "--city", help="only this city"),
    period: str | None = typer.Option(None, "--period", help="only this period label (e.g. 2010-05-01)"),
    json_out: Json = None,
) -> int:
    """Committed versions in a store, one per line (JSON: dataset, city, period, version, epsilon, rho,
    mechanism, url)."""
    from tasks.storage.store import ReleaseStore

    st = ReleaseStore(store, create=False)
    from tasks.release_verdict import verdict_line

    rows = [{**m.listing(), "verdict": verdict_line(m.quality)} for m in st.list_releases(dataset, city, period)]
    if json_out is not None:
        emit_json(rows, json_out)
        return 0
    for r in rows:
        print(f"{r['dataset']}\t{r['city']}\t{r['period']}\tv{r['version']}\t"
              f"{budget_label(r['epsilon'], r.get('rho'))}\t{r['mechanism']}\t{r['url']}\t{r['verdict']}")
    if not rows:
        eprint(f"no committed releases in {st.url}")
    return 0


@app.command("show")
def show(release: Release, json_out: Json = None) -> int:
    """A release's manifest, after checking every file's sha256."""
    with fetch_release(release) as (manifest, _):
        pass
    if json_out is not None:
        emit_json({**manifest.body(), "url": manifest.url}, json_out)
        return 0
    m = manifest
    print(f"{m.dataset}/{m.city}/{m.period} v{m.version} (committed {m.committed_at or 'at an unrecorded time'})")
    chose = f" (chose {m.chosen_mechanism})" if m.chosen_mechanism else ""
    print(f"  mechanism {m.mechanism}{chose} {json.dumps(m.params, default=str)}")
    k = f", k={m.max_points_per_user}" if m.max_points_per_user is not None else ""
    print(f"  {budget_label(m.epsilon, m.rho)}, privacy unit {m.privacy_unit}{k}")
    print(f"  noise: {m.noise_source or 'not recorded'}; code: {m.code_version or 'not recorded'}")
    for c in m.privacy.charges:
        print(f"  charge {c.name}: {budget_label(c.epsilon, c.rho)}, sensitivity {c.sensitivity:g}")
    if m.ledger is None or m.ledger.seq is None:
        print("  ledger: not charged (seeded noise: an experiment, NOT FOR PUBLICATION)")
    else:
        home = f" in the ledger home {m.ledger.home}" if m.ledger.home else ""
        print(f"  paid by ledger entry #{m.ledger.seq} of dataset {m.ledger.dataset or m.dataset}{home}")
    print(f"  {m.url}")
    for f in m.files:
        print(f"  {f.name}\t{f.size} bytes\tsha256 {f.sha256[:16]}… ok")
    return 0


# `geodp releases list|show` and `geodp backfill` are the names scripts used before the noun-verb tree.
releases_app = noun("releases", "Same as `geodp release list|show`.",
                    hidden=True)
releases_app.command("list")(list_releases)
releases_app.command("show")(show)
