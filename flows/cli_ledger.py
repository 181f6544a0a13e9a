"""Privacy accounting commands: `geodp ledger` (what a person can have lost) and `geodp dataset`
(a dataset's policy: create, show, change, and give back a charge a killed run left behind)."""

from __future__ import annotations

import argparse
import json

from dpcore.privacy.accounting import budget_label
from flows.cli_common import CLIError, eprint


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("ledger", help="per dataset: the privacy policy and the most any one person can have lost")
    p.add_argument("store", metavar="STORE_URL")
    p.add_argument("--dataset", default=None, help="one dataset (default: all in the store)")
    p.add_argument("--entries", action="store_true", help="also list every ledger entry")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_ledger)

    p = sub.add_parser("dataset", help="a dataset's privacy policy: create, show, change; void a stale charge")
    ds = p.add_subparsers(dest="dataset_command", metavar="ACTION", required=True)
    q = ds.add_parser("create", help="create a dataset with an explicit policy (before its first release)")
    _policy_args(q, required=True)
    q.add_argument("--source", required=True, help="the input this dataset is released from (path or URL)")
    q.set_defaults(func=cmd_dataset_create)
    q = ds.add_parser("show", help="the policy, its change log and the worst-case loss so far")
    q.add_argument("store", metavar="STORE_URL")
    q.add_argument("dataset", metavar="DATASET")
    q.add_argument("--json", action="store_true")
    q.set_defaults(func=cmd_dataset_show)
    q = ds.add_parser("policy", help="change a dataset's policy (logged, with a reason)")
    _policy_args(q, required=False)
    q.add_argument("--reason", required=True, help="why (recorded in the policy log)")
    q.set_defaults(func=cmd_dataset_policy)
    q = ds.add_parser("void", help="give back a charge whose release was never staged or published "
                      "(a run killed between its charge and its files)")
    q.add_argument("store", metavar="STORE_URL")
    q.add_argument("dataset", metavar="DATASET")
    q.add_argument("--seq", type=int, required=True, help="ledger entry number (see `geodp ledger --entries`)")
    q.add_argument("--reason", required=True)
    q.set_defaults(func=cmd_dataset_void)


def _policy_args(q: argparse.ArgumentParser, required: bool) -> None:
    q.add_argument("store", metavar="STORE_URL")
    q.add_argument("dataset", metavar="DATASET")
    q.add_argument("--privacy-unit", choices=["user", "record"], default=None if not required else "user")
    q.add_argument("--max-points-per-user", type=int, default=None, metavar="K",
                   help="k: points kept per person per bound window (default 20)")
    q.add_argument("--bound-window", choices=["release", "day"], default=None,
                   help="k applies per release (default) or per UTC day (for daily schedules)")
    q.add_argument("--budget", type=float, required=required, default=None,
                   help="the most one person may lose over any window: ε, or ρ with --accounting zcdp")
    q.add_argument("--window-days", default=None, metavar="W|lifetime",
                   help="the window of the budget in UTC days, or 'lifetime' (default)")
    q.add_argument("--accounting", choices=["pure", "zcdp"], default=None,
                   help="pure ε with sequential composition (default) or ρ-zCDP")
    q.add_argument("--delta", type=float, default=None, help="δ for the (ε, δ) shown beside ρ (default 1e-9)")
    q.add_argument("--max-records-per-person", type=int, default=None, metavar="M",
                   help="public bound on records per person: lets record-level releases be charged m·ε")
    q.add_argument("--horizon", default=None, metavar="FIRST..LAST",
                   help="UTC days a release without a period covers")


def _policy_from_args(args: argparse.Namespace, base: dict | None) -> object:
    from dpcore.privacy.accounting import PrivacyPolicy

    d = dict(base or {})
    for name in ("privacy_unit", "max_points_per_user", "bound_window", "budget", "accounting", "delta",
                 "max_records_per_person"):
        v = getattr(args, name)
        if v is not None:
            d[name] = v
    if args.window_days is not None:
        text = str(args.window_days).strip().lower()
        if text == "lifetime":
            d["window_days"] = None
        else:
            try:
                d["window_days"] = int(text)
            except ValueError:
                raise CLIError(f"--window-days must be a whole number of days or 'lifetime', got {text!r}") from None
    if args.horizon is not None:
        if ".." not in args.horizon:
            raise CLIError("--horizon must be FIRST..LAST (UTC days)")
        d["horizon"] = tuple(args.horizon.split("..", 1))
    if d.get("privacy_unit") == "record":
        d["max_points_per_user"] = None
    elif d.get("max_points_per_user") is None:
        d["max_points_per_user"] = 20
    return PrivacyPolicy.from_dict(d)


def _ledger(args: argparse.Namespace, create: bool = False):
    from tasks.storage.ledger import DatasetLedger
    from tasks.storage.store import ReleaseStore

    return DatasetLedger(ReleaseStore(args.store, create=create), args.dataset)


def cmd_dataset_create(args: argparse.Namespace) -> int:
    from tasks.release_tasks import public_locator

    ledger = _ledger(args, create=True)
    if ledger.policy() is not None:
        raise CLIError(f"dataset {args.dataset!r} already has a policy; change it with `geodp dataset policy`")
    policy = _policy_from_args(args, None)
    ledger.bind_source(public_locator(args.source))
    stored = ledger.create_policy(policy, reason="created with `geodp dataset create`")
    if stored != policy:
        raise CLIError(f"dataset {args.dataset!r} got a different policy from a concurrent command")
    print(f"dataset {args.dataset}: {policy.describe()}")
    return 0


def cmd_dataset_show(args: argparse.Namespace) -> int:
    ledger = _ledger(args)
    log = ledger.policy_log()
    if not log:
        raise CLIError(f"dataset {args.dataset!r} has no policy in {ledger.store.url}")
    return _print_datasets(ledger.store, [args.dataset], args.json, entries=False, policy_log=True)


def cmd_dataset_policy(args: argparse.Namespace) -> int:
    ledger = _ledger(args)
    current = ledger.policy()
    if current is None:
        raise CLIError(f"dataset {args.dataset!r} has no policy yet; create it with `geodp dataset create`")
    policy = _policy_from_args(args, current.to_dict())
    if policy == current:
        raise CLIError("the new policy equals the current one; nothing to change")
    ledger.change_policy(policy, args.reason)
    loss = ledger.loss(policy)
    print(f"dataset {args.dataset}: {policy.describe()}")
    print(f"  worst case so far: {policy.unit}={loss['window']:.4g} over {policy.window_label} "
          f"(the change is logged with its reason)")
    if loss["window"] > policy.budget:
        eprint(f"warning: past releases already exceed the new budget ({loss['window']:.4g} > {policy.budget:g}); "
               "no further release fits until the window moves on")
    return 0


def cmd_dataset_void(args: argparse.Namespace) -> int:
    from tasks.storage.store import ReleaseStore

    ledger = _ledger(args)
    entry = next((e for e in ledger.entries() if e["seq"] == args.seq and e["kind"] == "charge"), None)
    if entry is None:
        raise CLIError(f"dataset {args.dataset!r} has no charge entry #{args.seq}")
    held = {h.charge.key for h in ledger.held() if h.seq == args.seq}
    store = ReleaseStore(args.store, create=False)
    published = []
    for c in entry["charges"]:
        if c["key"] not in held:
            continue
        for m in store.list_releases(args.dataset, c["city"], c["period"]):
            if (m.get("ledger") or {}).get("seq") == args.seq:
                published.append(f"{c['city']} {c['period']}")
        if _staged_with(store, args.dataset, c, args.seq):
            published.append(f"{c['city']} {c['period']} (staged)")
    if published:
        raise CLIError(f"entry #{args.seq} paid for noise that was staged or published ({', '.join(published)}); "
                       "it cannot be given back")
    if not held:
        raise CLIError(f"every charge of entry #{args.seq} is already void")
    ledger.void(args.seq, sorted(held), args.reason)
    print(f"voided {len(held)} charge(s) of entry #{args.seq}: {args.reason}")
    return 0


def _staged_with(store, dataset: str, charge: dict, seq: int) -> bool:
    prefix = f"releases/{dataset}/{charge['city']}/{charge['period']}"
    for version in store.listdir(prefix):
        for attempt in store.listdir(f"{prefix}/{version}"):
            try:
                paid = store.read_json(f"{prefix}/{version}/{attempt}/charge.json")
            except (FileNotFoundError, NotADirectoryError):
                continue
            if paid.get("seq") == seq:
                return True
    return False


def cmd_ledger(args: argparse.Namespace) -> int:
    from tasks.storage.ledger import datasets
    from tasks.storage.store import ReleaseStore

    store = ReleaseStore(args.store, create=False)
    names = [args.dataset] if args.dataset else datasets(store)
    if not names:
        eprint(f"the ledger of {store.url} is empty")
    return _print_datasets(store, names, args.json, entries=args.entries, policy_log=False)


def _print_datasets(store, names: list[str], as_json: bool, entries: bool, policy_log: bool) -> int:
    from tasks.storage.ledger import DatasetLedger

    out = []
    for name in names:
        ledger = DatasetLedger(store, name)
        policy = ledger.policy()
        if policy is None:
            raise CLIError(f"dataset {name!r} has no policy in {store.url}")
        log = ledger.entries()
        held = ledger.held(log)
        row = {"dataset": name, "policy": policy.to_dict(), "guarantee": policy.describe(),
               "loss": ledger.loss(policy), "charges": len(held),
               "voided": sum(len(e["voids"]) for e in log if e["kind"] == "void")}
        if entries:
            row["entries"] = log
        if policy_log:
            row["policy_log"] = ledger.policy_log()
        out.append(row)
    if as_json:
        print(json.dumps(out, indent=2))
        return 0
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
        for e in row.get("policy_log", []):
            print(f"  policy #{e['seq']} {e['created_at']}: {e['reason']}")
        for e in row.get("entries", []):
            if e["kind"] == "charge":
                for c in e["charges"]:
                    what = budget_label(c.get("epsilon"), c.get("rho"))
                    print(f"  #{e['seq']} {c['city']} {c['period']} {what} ×{c['multiplier']} {e['created_at']}")
            else:
                keys = ", ".join(f"#{v['seq']}" for v in e["voids"])
                print(f"  #{e['seq']} void of {keys}: {e['reason']}")
    return 0
