"""The persist step of a release: stage the noisy files beside the charge that pays for them, then
commit the manifest create-only (exactly once per release key, whatever runs race or die).

The protocol's objects (claims, attempts, seals) live in the store (tasks/storage/store.py); which
charge an attempt holds comes from tasks/ledger_tasks.py."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

from dpcore.synopsis.base import Synopsis
from dpcore.synopsis.uncertainty import release_quality
from tasks.config import canonical_hash
from tasks.lazy_task import task
from tasks.public_errors import retry_unless_refused
from tasks.release_city_plan import CityPlan, ReleaseError
from tasks.release_tasks import PREVIEW
from tasks.release_verdict import own_map_bands
from tasks.storage.held_charge import HeldCharge
from tasks.storage.manifest import InputRef, Manifest
from tasks.storage.store import CHARGE_REF as CHARGE
from tasks.storage.store import (
    AttemptSealed,
    ReleaseRef,
    ReleaseStore,
    StagedElsewhere,
    StoreError,
    as_store,
)


def _stage(store: ReleaseStore, ref: ReleaseRef, plan: CityPlan, synopsis: Synopsis, preview: bytes | None,
           held: HeldCharge) -> tuple[str, list[dict]]:
    """Stage this run's noise: its charge reference first, then the files (ReleaseStore.stage); the
    attempts of earlier holders of the same charge are sealed and emptied first."""
    paid_by, earlier = held.paid_by(plan.dataset), held.earlier_attempts()
    with tempfile.TemporaryDirectory(prefix="geodp-stage-") as tmp:
        names = synopsis.save(tmp)
        if preview:
            (Path(tmp) / PREVIEW).write_bytes(preview)
            names.append(PREVIEW)
        return store.stage(ref, tmp, names, held.attempt_name(), json.dumps(paid_by).encode(), earlier)


def _committed_by_newer_run(store: ReleaseStore, plan: CityPlan, held: HeldCharge, wait_s: float = 300.0) -> dict:
    """This run's attempt was sealed by a newer run of the same release, which holds the charge now:
    return its manifest once it commits."""
    import time

    from tasks.ledger_tasks import held_home

    home = held_home(store, held)
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        found = store.find_committed(plan.dataset, plan.city, plan.period.label, plan.release_key)
        if found is not None:
            return found
        if not any(h.charge.key == plan.release_key and h.store == home.scope for h in home.ledger(plan.dataset).held()):
            # the newer run gave the charge back: nothing of this release will commit
            raise ReleaseError(f"{plan.city}: a newer run of the same release took this one over and then "
                               "failed; nothing was committed, run the release again")
        time.sleep(1.0)
    raise ReleaseError(f"{plan.city}: a newer run of the same release took this one over and has not committed "
                       "yet; run the release again to see its result")


def _release_cache_key(context, parameters: dict[str, Any]) -> str:
    """Public inputs only: the store (its absolute URL and instance id, so another checkout's
    relative path or a deleted and re-made store never hits a stale entry) and the release key
    (dataset, city, period, config hash incl. data version)."""
    store = as_store(parameters["store_url"])
    parts = [store.url_of(""), store.instance_id(), parameters["plan"].release_key]
    return f"persist-manifest-{canonical_hash(parts)[:32]}"  # cached results are typed Manifests


@task(name="persist-release", retries=3, retry_delay_seconds=1, retry_condition_fn=retry_unless_refused,
      cache_key_fn=_release_cache_key, persist_result=True)
def persist_release(store_url: ReleaseStore | str, plan: CityPlan, synopsis: Synopsis | None, preview: bytes | None,
                    held: HeldCharge, code: str) -> Manifest:
    """Commit one city-release exactly once: claim a version, stage files, write the manifest.

    A committed manifest for the key is returned as is. A complete staged attempt left by a crashed
    run is committed instead of the new synopsis, so the noise drawn first is the noise published.
    ``synopsis`` may be None only when such a staged attempt exists. ``held`` is the ledger charge this
    run holds for the key (tasks.ledger_tasks.charge_ledger); its reference (``charge.json``) is the
    attempt's first file, so every noisy file sits beside the charge that covers it and the manifest
    names that charge. An attempt sealed by a newer run of the same charge returns that run's commit."""
    store = as_store(store_url)
    committed = store.find_committed(plan.dataset, plan.city, plan.period.label, plan.release_key)
    if committed is not None:
        return committed
    version, _ = store.claim_version(plan.dataset, plan.city, plan.period.label, plan.release_key)
    ref = ReleaseRef(plan.dataset, plan.city, plan.period.label, version)
    existing = store.manifest(ref)
    if existing is not None:
        return existing
    staged = store.staged_attempt(ref)
    if staged is None:
        if synopsis is None:
            raise ReleaseError(f"{plan.city}: nothing staged and no synopsis to persist")
        try:
            staged = _stage(store, ref, plan, synopsis, preview, held), False
        except StagedElsewhere:  # an earlier run of this charge completed first: commit its noise
            earlier = store.staged_attempt(ref)
            staged = None if earlier is None else (earlier, True)
        except AttemptSealed:
            return _committed_by_newer_run(store, plan, held)
    else:
        staged = staged, True
    if staged is None:
        raise StoreError(f"{store.url_of(ref.rel)}: a staged attempt vanished before the commit")
    (attempt, files), resumed = staged
    try:
        privacy = json.loads(store.read(f"{ref.rel}/{attempt}/synopsis.json"))["privacy"]
        paid_by = json.loads(store.read(f"{ref.rel}/{attempt}/{CHARGE}"))
    except FileNotFoundError:
        # a run of another charge committed the version and deleted this attempt as a stray
        existing = store.manifest(ref)
        if existing is None:
            raise StoreError(f"{store.url_of(ref.rel)}/{attempt}: a staged attempt vanished before the commit") from None
        return existing
    manifest = Manifest(
        dataset=plan.dataset, city=plan.city, period=plan.period.label, window=plan.period.to_dict(),
        version=version, release_key=plan.release_key, config_hash=plan.config_hash,
        mechanism=plan.mechanism, params=privacy.get("params", plan.params), epsilon=plan.epsilon,
        rho=plan.rho,
        max_points_per_user=plan.max_points_per_user if plan.privacy_unit == "user" else None,
        privacy_unit=plan.privacy_unit, noise_source=privacy.get("noise_source"),
        region=plan.region.to_dict(), slot_seconds=plan.slot_seconds,
        input=InputRef(source=plan.source, data_version=plan.data_version),
        code_version=code, config=plan.config, privacy=privacy,
        quality=({**release_quality(synopsis), **({"plan": plan.expected} if plan.expected else {}),
                  "own_map": own_map_bands(plan, synopsis)}
                 if synopsis is not None and not resumed else None),
        ledger=paid_by, attempt=attempt, resumed_staged_attempt=resumed,
        bounding=("each user bounded to k points per UTC day over all regions of the run" if plan.bound_per_day
                  else "each user bounded to k points once over all regions of the run, before the split by city")
        if plan.privacy_unit == "user" else
        f"record-level in a person-level dataset: each person bounded to m={plan.records_per_person} records "
        "once over all regions of the run, sensitivity 1 per record" if plan.records_per_person is not None
        else "record-level: no bounding, sensitivity 1",
        files=files,
    )
    body, created = store.commit(ref, manifest)
    if not created and body.attempt != attempt:
        # another attempt (of this charge or another) is the release: this complete one is never
        # published, and no later run commits it, so its noise goes now
        store.delete_attempt_data(ref, attempt)
    return body
