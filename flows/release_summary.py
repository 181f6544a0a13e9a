"""A release run's summary: what each city's release became, the dataset's guarantee and loss, and where
the tasks ran; typed here, a JSON-able dict (:meth:`RunSummary.to_dict`) where it leaves Python (the
flow's result, `geodp release run --json`), and the run's Prefect artifacts (a table, a markdown page).
"""

from __future__ import annotations

import base64
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from dpcore.mechanisms.st_resolution import SLOT_WARNING
from dpcore.privacy.accounting import budget_label
from tasks.release_verdict import verdict_line
from tasks.storage.manifest import Manifest
from tasks.storage.store import ReleaseStore


@dataclass
class ReleaseRow:
    """One city's line of a run's summary (its fields are the JSON keys `geodp release run --json` prints)."""

    city: str
    version: int
    epsilon: float | None
    rho: float | None
    mechanism: str
    chosen_mechanism: str | None
    status: str  # "committed" or "already committed"
    url: str | None
    region: dict | None
    slot_warnings: list[str] = field(default_factory=list)
    k_choice: dict | None = None
    no_verdict: str | None = None
    verdict: str | None = None

    @classmethod
    def of(cls, manifest: Manifest, status: str) -> ReleaseRow:
        plan = (manifest.quality or {}).get("plan") or {}
        return cls(city=manifest.city, version=manifest.version, epsilon=manifest.epsilon, rho=manifest.rho,
                   mechanism=manifest.mechanism, chosen_mechanism=manifest.chosen_mechanism, status=status,
                   url=manifest.url, region=manifest.region,
                   slot_warnings=[n for n in manifest.privacy.notes if n.startswith(SLOT_WARNING)],
                   k_choice=plan.get("k_choice"), no_verdict=_no_verdict(plan),
                   verdict=verdict_line(manifest.quality))


def _no_verdict(plan: dict) -> str | None:
    """Why the plan gave no verdict on a release (none of its bands known), or None when it gave one."""
    if not plan or any(b.get("worse_than_blank_map") is not None for b in plan.get("bands", [])):
        return None
    return plan.get("statement") or None


@dataclass
class RunSummary:
    """A run of one dataset and period. ``refused``: {"city", "period", "reason"} per city refused alone;
    ``dask``: where the tasks ran (the Prefect form only; the key is absent from the dict otherwise)."""

    dataset: str
    period: str
    store: str
    ledger: str
    policy: dict
    guarantee: str
    loss: dict | None
    seconds: float
    releases: list[ReleaseRow]
    refused: list[dict]
    dask: dict | None = None

    def to_dict(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out["releases"] = [asdict(r) for r in self.releases]
        if self.dask is None:
            del out["dask"]
        return out

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> RunSummary:
        """A summary as :meth:`to_dict` (a flow run's result, ``--json``) wrote it."""
        names = {f.name for f in fields(ReleaseRow)}
        rows = [ReleaseRow(**{k: v for k, v in r.items() if k in names}) for r in raw["releases"]]
        return cls(**{**{f.name: raw.get(f.name) for f in fields(cls)}, "releases": rows,
                      "refused": list(raw.get("refused") or [])})


def loss_line(policy: dict, loss: dict) -> str:
    unit = "ρ" if policy["accounting"] == "zcdp" else "ε"
    window = "lifetime" if policy["window_days"] is None else f"any {policy['window_days']} days"
    return (f"worst case so far for one person: {unit}={loss['window']:.4g} over {window} "
            f"(of {policy['budget']:g}), {unit}={loss['lifetime']:.4g} over the dataset's life")


def artifact_key(text: str) -> str:
    """Prefect artifact keys are lowercase letters, digits and dashes."""
    return "".join(c if c.isalnum() else "-" for c in text.lower()).strip("-")[:100] or "geodp"


#: The most preview bytes (base64) a summary inlines: Prefect refuses an event over 1.5 MB and drops
#: the artifact (a 14-city summary with every preview inline was 3.3 MB). Beyond it, previews are linked.
INLINE_PREVIEW_BYTES = 600_000


def artifacts(summary: RunSummary, results: dict[str, Manifest], store: ReleaseStore) -> None:
    """Table of cities, markdown summary with heatmaps of the released maps (never the true one)."""
    from prefect.artifacts import create_markdown_artifact, create_table_artifact

    key = artifact_key(f"release-{summary.dataset}-{summary.period}")
    create_table_artifact(
        [{"city": r.city, "budget": budget_label(r.epsilon, r.rho), "mechanism": r.chosen_mechanism or r.mechanism,
          "version": r.version, "status": r.status, "url": r.url} for r in summary.releases],
        key=key + "-cities", description="City-releases of this run (public configuration and noisy output only)")
    create_markdown_artifact(summary_markdown(summary, results, store), key=key + "-summary",
                             description="release summary")


def summary_markdown(summary: RunSummary | dict, results: dict[str, Manifest], store: ReleaseStore,
                     inline_limit: int = INLINE_PREVIEW_BYTES) -> str:
    """The run's summary: per city its release, quality and preview of the released map, inline when
    all previews together fit ``inline_limit`` (base64 bytes), else linked to their file in the store."""
    s = summary if isinstance(summary, RunSummary) else RunSummary.from_dict(summary)
    previews = {city: m.file("preview.png") for city, m in results.items()}
    inline = sum(-(-4 * f.size // 3) for f in previews.values() if f is not None) <= inline_limit
    lines = [f"# Release {s.dataset} / {s.period}", "",
             f"- store: `{s.store}`",
             f"- ledger: `{s.ledger}`" if s.ledger not in (None, s.store) else "",
             f"- guarantee: {s.guarantee}",
             f"- {loss_line(s.policy, s.loss)}" if s.loss else "",
             # no wall time: the data pass's duration grows with the private row count
             f"- {len(s.releases)} cities",
             _dask_line(s.dask), ""]
    for r in s.refused:
        lines.extend([f"## {r['city']} refused", f"- **{r['reason']}**", ""])
    for r in s.releases:
        lines.append(f"## {r.city} v{r.version} ({r.status})")
        lines.append(f"`{r.url}`")
        m = results[r.city]
        lines.extend(f"- **{note}**" for note in r.slot_warnings)
        if r.k_choice:
            lines.append(f"- {r.k_choice['statement']}")
        lines.append(f"- **{r.verdict}**" if r.verdict else "")
        quality = m.quality or {}
        if quality.get("statement"):
            lines.append(f"- {quality['statement']}")
        for band in quality.get("bands", []):
            lo, hi = band["query_sides_m"]
            verdict = "worse than a blank map" if band["worse_than_blank_map"] else "informative"
            lines.append(f"- squares of {lo:g}–{hi:g} m: expected |error| {band['expected_abs_error']:.3g} vs a "
                         f"typical released count {band['typical_released_count']:.3g} ({verdict})")
        png = previews[r.city]
        if png is not None and r.url and not inline:
            lines.append(f"- preview of the released map: [{png.name}]({r.url}/{png.path})")
        elif png is not None and r.url:
            try:
                rel = r.url.split(store.root + "/", 1)[1]
                data = store.read(f"{rel}/{png.path}")
                lines.append(f"![released heatmap](data:image/png;base64,{base64.b64encode(data).decode()})")
            except (IndexError, OSError):
                pass
        lines.append("")
    return "\n".join(lines)


def _dask_line(dask: dict | None) -> str:
    if not dask:
        return ""
    link = f"[Dask dashboard]({dask['dashboard']})" if dask.get("dashboard") else "Dask (no dashboard)"
    ran = ", ".join(f"{w['worker'] or 'not on a Dask worker'} (pid {w['pid']})" for w in dask["workers"])
    return f"- {link}; flow process pid {dask['flow_pid']}; tasks ran on: {ran or 'nothing to release'}"
