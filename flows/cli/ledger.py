"""`geodp ledger` (per dataset: the policy and the most one person can have lost) and `geodp dataset
create|show|policy|void` (a dataset's privacy policy, and giving back a charge a killed run left)."""

from __future__ import annotations

from typing import Annotated

import typer

from dpcore.privacy.accounting import budget_label
from flows.cli.common import CLIError, emit_json, eprint, noun
from flows.cli.inputs import ConfigFile, Json, Store

app = noun("dataset", "A dataset's privacy policy: create, show, change; give back a stale charge.")

Dataset = Annotated[str, typer.Argument(metavar="DATASET", show_default=False, help="dataset name in the store")]
K = Annotated[str | None, typer.Option("--max-points-per-user", metavar="K|auto",
                                       help="k: points kept per person per bound window (default 20), or auto: "
                                       "each release's plan chooses k ≤ 200 from the newest published release")]
BoundWindow = Annotated[str | None, typer.Option(
    "--bound-window", help="k applies per release or per UTC day (for daily schedules); default release")]
WindowDays = Annotated[str | None, typer.Option(
    "--window-days", metavar="W|lifetime", help="the window of the budget in UTC days, or lifetime (default)")]
Accounting = Annotated[str | None, typer.Option(
    "--accounting", help="pure: ε with sequential composition (default); zcdp: ρ-zCDP")]
Delta = Annotated[float | None, typer.Option("--delta", help="δ of the (ε, δ) shown beside ρ (default 1e-9)")]
MaxRecords = Annotated[int | None, typer.Option(
    "--max-records-per-person", metavar="M",
    help="public bound on records per person: lets record-level releases be charged m·ε")]
Horizon = Annotated[str | None, typer.Option("--horizon", metavar="FIRST..LAST",
                                             help="UTC days a release without a period covers")]


def _choice(value: str | None, allowed: tuple[str, ...], what: str) -> None:
    if value is not None and value not in allowed:
        raise CLIError(f"{what} must be one of {', '.join(allowed)}, got {value!r}")


def _policy(base: dict | None, **given) -> object:
    from dpcore.privacy.accounting import PrivacyPolicy

    _choice(given.get("privacy_unit"), ("user", "record"), "--privacy-unit")
    _choice(given.get("bound_window"), ("release", "day"), "--bound-window")
    _choice(given.get("accounting"), ("pure", "zcdp"), "--accounting")
    window_days, horizon = given.pop("window_days"), given.pop("horizon")
    k = given.pop("max_points_per_user")
    d = dict(base or {})
    if k is not None:
        from tasks.ledger_tasks import AUTO, AUTO_K_MAX

        auto = k.strip().lower() == AUTO
        try:
            d.update(max_points_per_user=AUTO_K_MAX if auto else int(k), k_auto=auto)
        except ValueError:
            raise CLIError(f"--max-points-per-user must be a whole number or auto, got {k!r}") from None
    d.update({k: v for k, v in given.items() if v is not None})
    if window_days is not None:
        text = str(window_days).strip().lower()
        if text == "lifetime":
            d["window_days"] = None
        else:
            try:
                d["window_days"] = int(text)
            except ValueError:
                raise CLIError(f"--window-days must be a whole number of days or 'lifetime', got {text!r}") from None
    if horizon is not None:
        from tasks.config import ConfigError, period_days

        try:
            d["horizon"] = period_days(horizon, "--horizon")
        except ConfigError as exc:
            raise CLIError(str(exc)) from exc
    if d.get("privacy_unit") == "record":
        d["max_points_per_user"], d["k_auto"] = None, False
    elif d.get("max_points_per_user") is None:
        d["max_points_per_user"] = 20
    return PrivacyPolicy.from_dict(d)


def _source_locators(source: str) -> list[str]:
    """The locators a dataset's source binds: the input and every file it holds now (just the input's
    own normalised locator when it does not exist yet)."""
    from dpcore.data.inputs import normalised_locator, resolve_input
    from dpcore.data.points import DataError

    try:
        return resolve_input(source).locators()
    except DataError:
        return [normalised_locator(source)]


def _home(store: str, create: bool = False, config: str | None = None):
    """The ledger home of STORE: the configured `ledger` (GEODP_LEDGER, else the `ledger` setting of
    --config or $GEODP_CONFIG), else the one STORE recorded, else STORE itself
    (tasks/storage/ledger_home.py)."""
    from tasks.settings import configured_ledger
    from tasks.storage.ledger_home import resolve_home
    from tasks.storage.store import ReleaseStore

    st = ReleaseStore(store, create=create)
    return st, resolve_home(st, configured_ledger(config))


def _ledger(store: str, dataset: str, config: str | None = None):
    return _home(store, config=config)[1].ledger(dataset)


@app.command("create")
def create(
    store: Store,
    dataset: Dataset,
    source: str = typer.Option(..., "--source", help="the input this dataset is released from (path or URL)"),
    budget: float = typer.Option(..., "--budget", help="the most one person may lose over any window: ε, or ρ "
                                 "with --accounting zcdp"),
    privacy_unit: str = typer.Option("user", "--privacy-unit", help="user or record"),
    max_points_per_user: K = None,
    bound_window: BoundWindow = None,
    window_days: WindowDays = None,
    accounting: Accounting = None,
    delta: Delta = None,
    max_records_per_person: MaxRecords = None,
    horizon: Horizon = None,
    config: ConfigFile = None,
) -> int:
    """Create a dataset with an explicit policy (before its first release)."""
    policy = _policy(None, privacy_unit=privacy_unit, max_points_per_user=max_points_per_user,
                     bound_window=bound_window, budget=budget, accounting=accounting, delta=delta,
                     max_records_per_person=max_records_per_person, window_days=window_days, horizon=horizon)
    st, home = _home(store, create=True, config=config)
    ledger = home.ledger(dataset)
    if ledger.policy() is not None:
        raise CLIError(f"dataset {dataset!r} already has a policy; change it with `geodp dataset policy`")
    home.bind(st)  # the store charges this home from now on
    ledger.bind_sources(_source_locators(source))
    stored = ledger.create_policy(policy, reason="created with `geodp dataset create`")
    if stored != policy:
        raise CLIError(f"dataset {dataset!r} got a different policy from a concurrent command")
    print(f"dataset {dataset}: {policy.describe()}")
    return 0


@app.command("show")
def show(store: Store, dataset: Dataset, json_out: Json = None, config: ConfigFile = None) -> int:
    """The policy, its change log and the worst-case loss so far."""
    ledger = _ledger(store, dataset, config)
    if not ledger.policy_log():
        raise CLIError(f"dataset {dataset!r} has no policy in {ledger.store.url}")
    return _print_datasets(ledger.store, [dataset], json_out, entries=False, policy_log=True)


@app.command("policy")
def change_policy(
    store: Store,
    dataset: Dataset,
    reason: str = typer.Option(..., "--reason", help="why (recorded in the policy log)"),
    budget: float | None = typer.Option(None, "--budget", help="the most one person may lose over any window"),
    privacy_unit: str | None = typer.Option(None, "--privacy-unit", help="user or record"),
    max_points_per_user: K = None,
    bound_window: BoundWindow = None,
    window_days: WindowDays = None,
    accounting: Accounting = None,
    delta: Delta = None,
    max_records_per_person: MaxRecords = None,
    horizon: Horizon = None,
    config: ConfigFile = None,
) -> int:
    """Change a dataset's policy (logged, with its reason)."""
    ledger = _ledger(store, dataset, config)
    current = ledger.policy()
    if current is None:
        raise CLIError(f"dataset {dataset!r} has no policy yet; create it with `geodp dataset create`")
    policy = _policy(current.to_dict(), privacy_unit=privacy_unit, max_points_per_user=max_points_per_user,
                     bound_window=bound_window, budget=budget, accounting=accounting, delta=delta,
                     max_records_per_person=max_records_per_person, window_days=window_days, horizon=horizon)
    if policy == current:
        raise CLIError("the new policy equals the current one; nothing to change")
    ledger.change_policy(policy, reason)
    loss = ledger.loss(policy)
    print(f"dataset {dataset}: {policy.describe()}")
    print(f"  worst case so far: {policy.unit}={loss['window']:.4g} over {policy.window_label} "
          f"(the change is logged with its reason)")
    if loss["window"] > policy.budget:
        eprint(f"warning: past releases already exceed the new budget ({loss['window']:.4g} > {policy.budget:g}); "
               "no further release fits until the window moves on")
    return 0


@app.command("void")
def void(
    store: Store,
    dataset: Dataset,
    seq: int = typer.Option(..., "--seq", help="ledger entry number (see `geodp ledger --entries`)"),
    reason: str = typer.Option(..., "--reason", help="why (recorded in the ledger)"),
    config: ConfigFile = None,
) -> int:
    """Give back a charge whose noise was never published (a run killed between its charge and its
    commit): the files of its attempts are deleted first; refused while any is left, when its release
    is committed, or when an attempt is completely staged (re-run the release: it commits that noise)."""
    from tasks.ledger_tasks import VoidRefused, void_entry

    st, home = _home(store, config=config)
    try:
        voided, deleted = void_entry(st, dataset, seq, reason, home)
    except VoidRefused as exc:
        raise CLIError(str(exc)) from None
    if deleted:
        print(f"deleted {len(deleted)} unpublished file(s) of the charge's attempts")
    print(f"voided {len(voided)} charge(s) of entry #{seq}: {reason}")
    return 0


def ledger(
    store: Store,
    dataset: str | None = typer.Option(None, "--dataset", help="one dataset (default: every dataset in the store)"),
    entries: bool = typer.Option(False, "--entries", help="also list every ledger entry"),
    json_out: Json = None,
    config: ConfigFile = None,
) -> int:
    """Per dataset: the privacy policy and the most any one person can have lost."""
    from tasks.storage.ledger import known_datasets

    _, home = _home(store, config=config)
    st = home.store
    if dataset:
        if home.elsewhere and json_out is None:
            print(f"ledger home: {home.url}")
        return _print_datasets(st, [dataset], json_out, entries=entries, policy_log=False, sweep=True)
    return _print_datasets(st, known_datasets(st), json_out, entries=entries, policy_log=False,
                           listing=home.url if home.elsewhere else None, sweep=True)


def _print_datasets(store, names: list[str], json_out: str | None, entries: bool, policy_log: bool,
                    listing: str | None = "", sweep: bool = False) -> int:
    """Print each dataset's policy and loss; with ``listing`` (not ""), the whole home is listed: a
    dataset with nothing charged or released (a first release that failed before its policy was
    written) is left out, and ``listing`` is the ledger home to name when it is not the store. With
    ``sweep``, once a dataset verifies, the files of sealed or abandoned attempts of its committed
    releases are deleted (ReleaseStore.sweep_committed): they are never published."""
    from tasks.storage.ledger import ENTRY_HASH, DatasetLedger
    from tasks.storage.ledger_home import release_stores

    out = []
    for name in names:
        ledger = DatasetLedger(store, name)
        log = ledger.verify()  # the chain, the releases, the policy and the bindings: else exit 2
        swept = [f for st in release_stores(store) for f in st.sweep_committed(name)] if sweep else []
        if swept:
            eprint(f"{name}: deleted {len(swept)} file(s) of sealed or abandoned attempts of committed "
                   "releases (never published; the committed release's charge covered them)")
        policy = ledger.policy()
        if policy is None and listing != "":
            continue
        if policy is None:
            raise CLIError(f"dataset {name!r} has no policy in {store.url}")
        held = ledger.held(log)
        row = {"dataset": name, "policy": policy.to_dict(), "guarantee": policy.describe(),
               "loss": ledger.loss(policy), "charges": len(held),
               "voided": sum(len(e["voids"]) for e in log if e["kind"] == "void"),
               "chain": {"verified": True, "entries": len(log), "head_sha256": log[-1][ENTRY_HASH] if log else None}}
        if entries:
            row["entries"] = log
        if policy_log:
            row["policy_log"] = ledger.policy_log()
        out.append(row)
    if json_out is not None:
        emit_json(out, json_out)
        return 0
    if listing != "" and not out:
        eprint(f"the ledger of {store.url} is empty")
    elif listing:
        print(f"ledger home: {listing}")
    for row in out:
        p, loss = row["policy"], row["loss"]
        unit = "ρ" if p["accounting"] == "zcdp" else "ε"
        window = "lifetime" if p["window_days"] is None else f"any {p['window_days']} days"
        print(f"{row['dataset']}: {row['guarantee']}")
        eps = ""
        if p["accounting"] == "zcdp":
            eps = f" (ε={loss['window_epsilon']:.3g} / {loss['lifetime_epsilon']:.3g} at δ={p['delta']:g})"
        print(f"  worst case so far for one person: {unit}={loss['window']:.4g} of {p['budget']:g} over {window}; "
              f"{unit}={loss['lifetime']:.4g} over the dataset's life{eps}")
        print(f"  {row['charges']} charge(s) held, {row['voided']} given back")
        chain = row["chain"]
        head = f", head {chain['head_sha256'][:16]}…" if chain["head_sha256"] else ""
        print(f"  ledger chain verified: {chain['entries']} entr{'y' if chain['entries'] == 1 else 'ies'}{head}; "
              "every committed or staged release names an entry of it")
        for e in row.get("policy_log", []):
            print(f"  policy #{e['seq']} {e['created_at']}: {e['reason']}")
        for e in row.get("entries", []):
            if e["kind"] == "charge":
                for c in e["charges"]:
                    what = budget_label(c.get("epsilon"), c.get("rho"))
                    where = f" into {e['store']}" if e.get("store") else ""
                    print(f"  #{e['seq']} {c['city']} {c['period']} {what} ×{c['multiplier']} {e['created_at']}{where}")
            elif e["kind"] == "adopt":
                keys = ", ".join(f"#{a['seq']}" for a in e["adopts"])
                print(f"  #{e['seq']} takes over {keys}: {e['reason']}")
            else:
                keys = ", ".join(f"#{v['seq']}" for v in e["voids"])
                print(f"  #{e['seq']} void of {keys}: {e['reason']}")
    return 0
