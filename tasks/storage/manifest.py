"""The release manifest as one typed model: what `persist_release` writes and what the store returns.

A manifest is the commit point of one city-release (tasks/storage/store.py). It is written in one
place (tasks/persist_tasks.py: persist_release) and read through :class:`Manifest` everywhere else
(flows, CLI, ledger), so a field is named once. Adding a field is one line here: give it a default,
so manifests committed before it existed still load.

Parsing is tolerant of what older geodp versions wrote (optional fields missing, the ledger
reference under its first name ``ledger_entry``) and keeps unknown fields (``extra="allow"``): a
manifest written by a newer geodp loads and shows them. A manifest missing a field every version
wrote is refused with one line naming the field, never a KeyError deep in a reader.
"""

from __future__ import annotations

from typing import Any

from pydantic import AliasChoices, BaseModel, ConfigDict, Field, ValidationError

MANIFEST_FORMAT = "geodp-release/1"


class _Open(BaseModel):
    """Sub-objects keep fields this version does not know (written by a newer geodp)."""

    model_config = ConfigDict(extra="allow", frozen=True)


class ManifestFile(_Open):
    """One released file: its name in the release, its path under the version, sha256 and size."""

    name: str
    path: str
    sha256: str
    size: int


class LedgerRef(_Open):
    """The ledger charge that paid for the noise a release publishes ({"seq", "draw", "key"}) and the
    ledger that holds it (``home``, tasks/storage/ledger_home.py); seq None for an experiment with
    seeded noise (never charged)."""

    dataset: str | None = None
    seq: int | None = None
    draw: str | None = None
    key: str | None = None
    entry_sha256: str | None = None  # the entry's own hash: its deletion cannot hide (tasks/storage/ledger.py)
    home: str | None = None  # the ledger home that holds the entry; None: the store holding the release
    created_at: str | None = None  # written by the first manifest format (``ledger_entry``)


class InputRef(_Open):
    """The input's public identity: its locator and its public data version (never its content)."""

    source: str = ""
    data_version: str | None = None


class PrivacyCharge(_Open):
    """One noisy step of the fit: ε (or ρ) spent at a sensitivity."""

    name: str
    epsilon: float | None = None
    rho: float | None = None
    sensitivity: float


class ManifestPrivacy(_Open):
    """The synopsis's privacy statement (dpcore.synopsis.base.PrivacyInfo.to_dict), verbatim."""

    charges: list[PrivacyCharge] = Field(default_factory=list)
    noise_source: str | None = None
    params: dict[str, Any] = Field(default_factory=dict)
    notes: list[str] = Field(default_factory=list)


class Manifest(_Open):
    """A committed release's manifest. ``url`` is where the store found it (not part of the body)."""

    format: str = MANIFEST_FORMAT
    dataset: str
    city: str
    period: str
    version: int
    release_key: str
    config_hash: str | None = None
    window: dict[str, Any] | None = None
    mechanism: str
    params: dict[str, Any] = Field(default_factory=dict)
    epsilon: float | None = None
    rho: float | None = None
    max_points_per_user: int | None = None
    privacy_unit: str = "user"
    noise_source: str | None = None
    region: dict[str, Any]
    slot_seconds: int | None = None
    input: InputRef = Field(default_factory=InputRef)
    code_version: str | None = None
    config: dict[str, Any] = Field(default_factory=dict)
    privacy: ManifestPrivacy = Field(default_factory=ManifestPrivacy)
    quality: dict[str, Any] | None = None
    ledger: LedgerRef | None = Field(default=None, validation_alias=AliasChoices("ledger", "ledger_entry"))
    attempt: str | None = None
    resumed_staged_attempt: bool = False
    bounding: str | None = None
    files: list[ManifestFile]
    committed_at: str | None = None
    manifest_sha256: str | None = None
    url: str | None = Field(default=None, exclude=True)

    def body(self) -> dict[str, Any]:
        """The body as committed (without ``url``, which is where a reader found it). Python mode: a
        mechanism's parameters may hold numpy scalars, which the store's JSON encoder writes."""
        return self.model_dump(by_alias=True)

    def located(self, url: str) -> Manifest:
        return self.model_copy(update={"url": url})

    def file(self, name: str) -> ManifestFile | None:
        return next((f for f in self.files if f.name == name), None)

    @property
    def chosen_mechanism(self) -> str | None:
        """What a self-choosing mechanism (auto) ran; None for the others."""
        chosen = self.params.get("chosen")
        return chosen.get("mechanism") if isinstance(chosen, dict) else None

    def listing(self) -> dict[str, Any]:
        """The row `geodp release list --json` prints (its keys are a public interface)."""
        return {"dataset": self.dataset, "city": self.city, "period": self.period, "version": self.version,
                "epsilon": self.epsilon, "rho": self.rho, "mechanism": self.mechanism, "url": self.url}


class ManifestError(ValueError):
    """A stored manifest that is not a release manifest (a field is missing or of the wrong type)."""


def parse_manifest(raw: Any, where: str) -> Manifest:
    """The typed manifest of a stored JSON body; a one-line ManifestError naming the bad field."""
    try:
        return Manifest.model_validate(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        field = ".".join(str(x) for x in first["loc"]) or "(top level)"
        raise ManifestError(f"{where} is not a release manifest: {field}: {first['msg']}") from None
