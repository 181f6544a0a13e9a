"""The release store and the privacy ledger: immutable, versioned releases on any fsspec URL.

Storage I/O lives here, outside dpcore. A store is an fsspec URL (``file://`` or a plain path by
default, ``s3://bucket/prefix`` against any S3-compatible endpoint). Layout::

    releases/<dataset>/<city>/<period>/v<N>/_CLAIM.json        version N reserved for one release key
    releases/<dataset>/<city>/<period>/v<N>/<attempt>/...      data files of one attempt
    releases/<dataset>/<city>/<period>/v<N>/<attempt>/_STAGED.json   attempt complete (file list + hashes)
    releases/<dataset>/<city>/<period>/v<N>/_MANIFEST.json     the commit point, written last
    datasets/<dataset>/...                                     policy and ledger (tasks/storage/ledger.py)

Every object is written **create-only** (temp file + ``link()`` locally, ``If-None-Match: *`` on S3): nothing
is ever overwritten. The version claims (and the ledger, tasks/storage/ledger.py) are *create-only logs*: a
writer lists the log, checks it and creates entry number ``len(log)``. Two writers racing for the same
number cannot both succeed, and the loser re-reads the log and checks again, so a successful writer has
always seen every earlier entry: the log is linearizable without any lock service.

Exactly once: a release key (dataset, city, period, config hash) gets one version. A re-run finds the committed manifest and returns it. A run that crashed after staging its
data but before the manifest is finished by the next run *with the already-noised data* (no second
noisy copy is drawn); an attempt that crashed mid-upload is deleted before new noise is staged.
Readers only see versions whose ``_MANIFEST.json`` exists, and verify sha256 and size on read.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path
from typing import Any

import fsspec

from dpcore.data.inputs import storage_options_from_env as _storage_options_from_env
from dpcore.synopsis.base import json_default
from tasks.storage.attempts import AttemptProtocol
from tasks.storage.manifest import MANIFEST_FORMAT, Manifest, ManifestError, ManifestFile, parse_manifest
from tasks.storage.objects import (  # noqa: F401 - the store's names, imported from here by callers
    CHARGE_REF,
    CLAIM,
    MANIFEST,
    SEALED,
    STAGED,
    STORE_ID,
    AttemptSealed,
    IntegrityError,
    ReleaseRef,
    StagedElsewhere,
    StoreError,
    sha256_bytes,
    utc_now,
)

_MAX_APPEND_TRIES = 200
_SLUG = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]*$")
MANIFEST_HASH = "manifest_sha256"


def manifest_hash(body: dict) -> str:
    """sha256 of a manifest's canonical JSON without its own hash field."""
    rest = json.loads(json.dumps({k: v for k, v in body.items() if k != MANIFEST_HASH}, default=json_default))
    return sha256_bytes(json.dumps(rest, sort_keys=True, separators=(",", ":")).encode())


def budget_text(epsilon: float | None, rho: float | None) -> str:
    return f"ρ={rho:g}" if epsilon is None and rho is not None else f"ε={epsilon:g}" if epsilon is not None else "no budget"


def check_slug(value: str, what: str) -> str:
    if not isinstance(value, str) or not _SLUG.match(value):
        raise StoreError(f"{what} {value!r} must be letters, digits, '.', '_', '+' or '-' (no slashes)")
    return value


def storage_errors() -> tuple[type[BaseException], ...]:
    """What a storage backend raises when it fails (a full disk, an unreachable endpoint, a refused
    request): turned into one-line StoreErrors, never a traceback."""
    errors: list[type[BaseException]] = [OSError]
    try:
        import botocore.exceptions as boto

        errors += [boto.BotoCoreError, boto.ClientError]
    except ImportError:  # pragma: no cover - s3fs is a dependency
        pass
    try:
        import aiohttp

        errors.append(aiohttp.ClientError)
    except ImportError:  # pragma: no cover
        pass
    return tuple(errors)


def short_error(exc: BaseException) -> str:
    """One line naming a storage failure: its kind and the first line of its message."""
    if isinstance(exc, OSError) and exc.errno and exc.strerror:
        text = exc.strerror  # e.g. "No space left on device"
    else:
        lines = str(exc).strip().splitlines()
        text = lines[0] if lines else type(exc).__name__
    return text if type(exc) in (OSError, StoreError) else f"{type(exc).__name__}: {text}"


#: Set inside :func:`dry_run`: stores opened there read only.
_DRY_RUN: ContextVar[bool] = ContextVar("geodp_store_dry_run", default=False)


@contextmanager
def dry_run() -> Iterator[None]:
    """Every store opened inside reads only: a missing local folder stays missing (it reads as an empty
    store) and a write or delete raises StoreError, so a dry run (`release plan`) writes nothing."""
    token = _DRY_RUN.set(True)
    try:
        yield
    finally:
        _DRY_RUN.reset(token)


class ReleaseStore(AttemptProtocol):
    """One store URL. Safe to share between processes and machines (no local state but a read cache
    of immutable objects)."""

    def __init__(self, url: str, storage_options: dict[str, Any] | None = None, create: bool = True):
        if not url:
            raise StoreError("a store URL is required (a local folder, file:///path or s3://bucket/prefix)")
        self.url = str(url).rstrip("/")
        protocol = self.url.split("://", 1)[0] if "://" in self.url else "file"
        opts = {**_storage_options_from_env(protocol), **(storage_options or {})}
        try:
            self.fs, root = fsspec.core.url_to_fs(self.url, **opts)
        except (ImportError, ValueError) as exc:
            raise StoreError(f"cannot open store {self.url!r}: {exc}") from exc
        self.protocol = protocol
        self.local = protocol in ("file", "local")
        self.dry_run = _DRY_RUN.get()
        self.root = root.rstrip("/")
        if self.local:
            self.root = str(Path(self.root).resolve())
            if not create and not Path(self.root).is_dir():
                raise StoreError(f"no release store at {self.root}")
            if not self.dry_run:
                with self._io("create", ""):
                    Path(self.root).mkdir(parents=True, exist_ok=True)
        elif protocol in ("s3", "s3a"):
            # A bucket is never created by geodp: a missing one is an error, not an empty store.
            bucket = self.root.split("/", 1)[0]
            try:
                self.fs.info(bucket)
            except FileNotFoundError:
                raise StoreError(f"no bucket {bucket!r} for store {self.url} (create it first)") from None
            except storage_errors() as exc:
                raise StoreError(f"cannot reach the store {self.url}: {short_error(exc)}") from None
        self._cache: dict[str, bytes] = {}  # immutable objects only (create-only writes)

    @contextmanager
    def _io(self, what: str, rel: str) -> Iterator[None]:
        """Storage failures as one-line StoreErrors; FileNotFoundError and FileExistsError pass (they
        are answers, not failures)."""
        if self.dry_run and what in ("create", "write", "delete"):
            raise StoreError(f"a dry run writes nothing: it would {what} {self.url_of(rel)}")
        try:
            yield
        except (FileNotFoundError, FileExistsError, StoreError):
            raise
        except storage_errors() as exc:
            raise StoreError(f"cannot {what} {self.url_of(rel)}: {short_error(exc)}") from None

    # -- primitives -----------------------------------------------------------------------------
    def path(self, rel: str) -> str:
        return f"{self.root}/{rel}" if rel else self.root

    def url_of(self, rel: str) -> str:
        if self.local:
            return f"{self.root}/{rel}"
        return f"{self.protocol}://{self.root}/{rel}"

    def create(self, rel: str, data: bytes) -> None:
        """Write an object that must not exist yet; FileExistsError if it does (create-only)."""
        with self._io("write", rel):
            self._create(rel, data)

    def _create(self, rel: str, data: bytes) -> None:
        p = self.path(rel)
        if self.local:
            # Write a private temporary file, then hard-link it to the final name: link() fails if the
            # name exists (create-only) and publishes the complete content atomically, so a reader never
            # sees a half-written object.
            parent = Path(p).parent
            # A run deleting an abandoned attempt deletes temporary files too (they hold noise): a seal
            # or charge reference whose temporary file vanished is written again; a data file is not.
            tries = 5 if rel.rsplit("/", 1)[-1] in (STAGED, CHARGE_REF) else 1
            for left in range(tries - 1, -1, -1):
                parent.mkdir(parents=True, exist_ok=True)
                tmp = parent / f".tmp-{uuid.uuid4().hex}"
                try:
                    with open(tmp, "xb") as f:
                        f.write(data)
                        f.flush()
                        os.fsync(f.fileno())
                    os.link(tmp, p)
                    return
                except FileNotFoundError:
                    if Path(p).exists():
                        raise FileExistsError(p) from None
                    if not left:
                        raise
                finally:
                    tmp.unlink(missing_ok=True)
            return
        self.fs.pipe_file(p, data, mode="create")

    def instance_id(self) -> str:
        """A random id created once per store (create-only ``_STORE_ID``). A store that is deleted
        and made again at the same URL gets a new id, so caches keyed on it cannot go stale."""
        try:
            self.create(STORE_ID, uuid.uuid4().hex.encode())
        except FileExistsError:
            pass
        return self.read(STORE_ID, cache=False).decode().strip()

    def read(self, rel: str, cache: bool = True) -> bytes:
        if cache and rel in self._cache:
            return self._cache[rel]
        with self._io("read", rel):
            try:
                data = self.fs.cat_file(self.path(rel))
            except FileNotFoundError:
                # s3fs may answer from a listing it cached before the object existed: ask the store itself
                self.fs.invalidate_cache(self.path(rel))
                data = self.fs.cat_file(self.path(rel))
            except (IsADirectoryError, NotADirectoryError):
                raise FileNotFoundError(self.url_of(rel)) from None
        if cache:
            self._cache[rel] = data
        return data

    def read_many(self, rels: list[str]) -> dict[str, bytes]:
        """Several objects in one batched read, keyed by ``rel``. s3fs sizes each object from any listing it
        cached of a folder above it, so an object another process made after that listing would raise
        FileNotFoundError: every parent's cached listing is dropped first (invalidate_cache drops the
        folders above a path too)."""
        if not rels:
            return {}
        for parent in {rel.rsplit("/", 1)[0] if "/" in rel else "" for rel in rels}:
            self.fs.invalidate_cache(self.path(parent))
        paths = {self.path(rel): rel for rel in rels}
        with self._io("read", rels[0]):
            return {paths[p]: data for p, data in self.fs.cat(list(paths)).items()}

    def read_json(self, rel: str) -> dict:
        try:
            return json.loads(self.read(rel))
        except json.JSONDecodeError as exc:
            raise StoreError(f"{self.url_of(rel)} is not valid JSON: {exc}") from exc

    def exists(self, rel: str) -> bool:
        with self._io("read", rel):
            return bool(self.fs.exists(self.path(rel)))

    def find(self, rel: str, name_ok=lambda name: True) -> list[str]:
        """Every object under ``rel`` (any depth) whose file name ``name_ok`` accepts, as store-relative
        paths, sorted, from a fresh listing (empty when ``rel`` does not exist)."""
        root = self.path(rel)
        base = self.root + "/"
        try:
            with self._io("list", rel):
                self.fs.invalidate_cache(root)
                found = self.fs.find(root)
        except (FileNotFoundError, NotADirectoryError):
            return []
        return sorted(p[len(base):] for p in found if p.startswith(base) and name_ok(p.rsplit("/", 1)[-1]))

    def listdir(self, rel: str) -> list[str]:
        """Names directly under rel (empty when it does not exist)."""
        p = self.path(rel)
        try:
            with self._io("list", rel):
                self.fs.invalidate_cache(p)
                entries = self.fs.ls(p, detail=False)
        except (FileNotFoundError, NotADirectoryError):
            return []
        return sorted({e.rstrip("/").rsplit("/", 1)[-1] for e in entries} - {""})

    # -- create-only logs -----------------------------------------------------------------------
    def _log_entries(self, prefix: str, pattern: re.Pattern) -> list[tuple[int, str]]:
        out = []
        for name in self.listdir(prefix):
            m = pattern.match(name)
            if m:
                out.append((int(m.group(1)), name))
        return sorted(out)

    # -- versions -------------------------------------------------------------------------------
    _VERSION_NAME = re.compile(r"^v(\d+)$")

    def _period_prefix(self, dataset: str, city: str, period: str) -> str:
        for v, what in ((dataset, "dataset"), (city, "city"), (period, "period")):
            check_slug(v, what)
        return f"releases/{dataset}/{city}/{period}"

    def versions(self, dataset: str, city: str, period: str) -> list[int]:
        return [n for n, _ in self._log_entries(self._period_prefix(dataset, city, period), self._VERSION_NAME)]

    def claim_version(self, dataset: str, city: str, period: str, release_key: str) -> tuple[int, bool]:
        """The version number of a release key: an existing claim, or the next number, claimed
        create-only (``v<N>/_CLAIM.json``). Returns (N, created)."""
        prefix = self._period_prefix(dataset, city, period)
        for _ in range(_MAX_APPEND_TRIES):
            nums = self.versions(dataset, city, period)
            unclaimed = []
            for n in nums:
                try:
                    claim = self.read_json(f"{prefix}/v{n}/{CLAIM}")
                except FileNotFoundError:
                    # a folder whose claim is being written right now (or never was): claim that number,
                    # so two runs of one key race for the same file instead of taking v<N> and v<N+1>
                    unclaimed.append(n)
                    continue
                if claim["release_key"] == release_key:
                    return n, False
            n = unclaimed[0] if unclaimed else (max(nums) + 1 if nums else 1)
            claim = {"release_key": release_key, "version": n, "created_at": utc_now()}
            try:
                self.create(f"{prefix}/v{n}/{CLAIM}", json.dumps(claim).encode())
            except FileExistsError:
                continue
            return n, True
        raise StoreError(f"{prefix} is too contended: gave up claiming a version")

    def manifest(self, ref: ReleaseRef) -> Manifest | None:
        try:
            return self.read_manifest(ref.rel)
        except FileNotFoundError:
            return None

    def read_manifest(self, version_rel: str) -> Manifest:
        """A committed manifest, checked against its own hash (an altered one is an IntegrityError), typed
        (tasks/storage/manifest.py) and located at its version's URL."""
        where = f"{self.url_of(version_rel)}/{MANIFEST}"
        m = self.read_json(f"{version_rel}/{MANIFEST}")
        if not isinstance(m, dict) or not isinstance(m.get("files"), list):
            raise IntegrityError(f"{where} is not a release manifest")
        # Every commit writes the hash, except the first manifest format's (no "format" field, the charge
        # under "ledger_entry"); such a manifest loads only while it names its charge, which is then
        # checked against the ledger below like any other.
        legacy = "format" not in m and isinstance(m.get("ledger_entry"), dict)
        if MANIFEST_HASH in m and manifest_hash(m) != m[MANIFEST_HASH]:
            raise IntegrityError(f"{where} was altered after it was committed "
                                 "(its content does not match its recorded sha256)")
        try:
            manifest = parse_manifest(m, where).located(self.url_of(version_rel))
        except ManifestError as exc:
            raise IntegrityError(str(exc)) from None
        if MANIFEST_HASH not in m and not legacy:
            raise IntegrityError(f"{where} has no {MANIFEST_HASH}: a commit always writes one, so it was edited")
        self._check_paid(manifest, where)
        return manifest

    def _check_paid(self, manifest: Manifest, where: str) -> None:
        """The manifest agrees with the ledger entry it names: the entry's hash, and the ε or ρ charged
        for its release key. A manifest edited with its own hash recomputed (a smaller ε claimed after
        the fact) is an IntegrityError. A missing entry is DatasetLedger.verify's to report."""
        paid = manifest.ledger
        if paid is None or paid.seq is None:
            return  # seeded experiments are never charged
        try:
            ledger = self if paid.home is None or paid.home == self.url_of("").rstrip("/") else \
                self._ledger_home(paid.home)
            entry = ledger.read_json(f"datasets/{manifest.dataset}/ledger/{int(paid.seq):08d}.json")
        except FileNotFoundError:
            return
        except StoreError:
            return  # a ledger home this reader cannot reach: `geodp ledger` verifies it where it can
        charges = entry.get("charges") if isinstance(entry, dict) else None
        charge = next((c for c in charges or [] if isinstance(c, dict) and c.get("key") == manifest.release_key),
                      None)

        def same(a: float | None, b: float | None) -> bool:
            return (a is None) == (b is None) and (a is None or abs(float(a) - float(b)) <= 1e-12 * max(1.0, abs(a)))

        if charge is None or (paid.entry_sha256 and entry.get("entry_sha256") != paid.entry_sha256) \
                or not same(_paid_epsilon(charge), manifest.epsilon) or not same(charge.get("rho"), manifest.rho):
            raise IntegrityError(f"{where} disagrees with ledger entry #{paid.seq}, which paid for its noise "
                                 f"(the manifest says {budget_text(manifest.epsilon, manifest.rho)}; the ledger "
                                 f"charged {budget_text(charge.get('epsilon'), charge.get('rho')) if charge else 'no such release'})")

    def _ledger_home(self, url: str) -> ReleaseStore:
        """The ledger home a manifest names (tasks/storage/ledger_home.py), opened once for reading."""
        homes = self.__dict__.setdefault("_homes", {})
        if url not in homes:
            homes[url] = ReleaseStore(url, create=False)
        return homes[url]

    def commit(self, ref: ReleaseRef, manifest: Manifest) -> tuple[Manifest, bool]:
        """Write the manifest create-only: the commit point. If another run of the same release key
        committed first, its manifest is returned (``created`` False) and ours is dropped."""
        for f in manifest.files:  # the attempt must be whole right before it becomes the release
            try:
                self._verified(ref.rel, f, cache=False)
            except FileNotFoundError:
                existing = self.manifest(ref)  # another run committed and cleared the losing attempts
                if existing is not None:
                    return existing, False
                raise IntegrityError(f"staged file {self.url_of(ref.rel + '/' + f.path)} is missing; "
                                     "not committed") from None
        body = {**manifest.body(), "format": MANIFEST_FORMAT, "committed_at": utc_now()}
        body.pop(MANIFEST_HASH, None)
        body[MANIFEST_HASH] = manifest_hash(body)
        data = json.dumps(body, indent=2, default=json_default).encode()
        for wait in (0.0, 0.1, 0.3, 1.0, 3.0):
            time.sleep(wait)
            try:
                self.create(f"{ref.rel}/{MANIFEST}", data)
                break
            except FileExistsError:
                # Another run committed first, or (S3) two conditional writes collided and the store
                # refused both: read the winner, else try to commit again.
                existing = self.manifest(ref)
                if existing is not None:
                    return existing, False
        else:
            raise StoreError(f"{ref.rel}/{MANIFEST} could not be committed or read") from None
        return parse_manifest(body, f"{self.url_of(ref.rel)}/{MANIFEST}").located(self.url_of(ref.rel)), True

    def find_committed(self, dataset: str, city: str, period: str, release_key: str) -> Manifest | None:
        for n in self.versions(dataset, city, period):
            m = self.manifest(ReleaseRef(dataset, city, period, n))
            if m is not None and m.release_key == release_key:
                return m
        return None

    # -- readers --------------------------------------------------------------------------------
    def list_releases(self, dataset: str | None = None, city: str | None = None,
                      period: str | None = None) -> list[Manifest]:
        """Manifests of every committed version (versions without a manifest do not exist)."""
        out = []
        for ds in [dataset] if dataset else self.listdir("releases"):
            for c in [city] if city else self.listdir(f"releases/{ds}"):
                for per in [period] if period else self.listdir(f"releases/{ds}/{c}"):
                    for n in self.versions(ds, c, per):
                        m = self.manifest(ReleaseRef(ds, c, per, n))
                        if m is not None:
                            out.append(m)
        return out

    def _verified(self, version_rel: str, f: ManifestFile | dict, cache: bool = True) -> bytes:
        if not isinstance(f, ManifestFile):  # a _STAGED.json entry
            try:
                f = ManifestFile.model_validate(f)
            except ValueError:
                raise IntegrityError(f"{self.url_of(version_rel)} lists a malformed file entry") from None
        data = self.read(f"{version_rel}/{f.path}", cache=cache)
        if len(data) != f.size or sha256_bytes(data) != f.sha256:
            raise IntegrityError(
                f"integrity check failed for {self.url_of(version_rel + '/' + f.path)}: expected sha256 "
                f"{f.sha256[:16]}… and {f.size} bytes, got {sha256_bytes(data)[:16]}… and {len(data)} bytes"
            )
        return data

    def fetch(self, version_rel: str, dest: str | Path) -> tuple[Manifest, Path]:
        """Download a committed version's files into dest, verifying every sha256; returns (manifest, dest)."""
        try:
            manifest = self.read_manifest(version_rel)
        except FileNotFoundError:
            raise StoreError(f"no committed release at {self.url_of(version_rel)} (no {MANIFEST})") from None
        d = Path(dest)
        d.mkdir(parents=True, exist_ok=True)
        for f in manifest.files:
            name = Path(f.name)
            if name.is_absolute() or ".." in name.parts:
                raise IntegrityError(f"manifest of {self.url_of(version_rel)} names an unsafe path {f.name!r}")
            try:
                data = self._verified(version_rel, f)
            except FileNotFoundError:
                raise IntegrityError(f"{self.url_of(version_rel + '/' + f.path)}, listed in the manifest, "
                                     "is missing") from None
            (d / name).parent.mkdir(parents=True, exist_ok=True)
            (d / name).write_bytes(data)
        return manifest, d


def _paid_epsilon(charge: dict) -> float | None:
    """The ε a release's charge paid for: its own, plus its contribution profile's where that was charged
    apart, before it (tasks/release_profile.py)."""
    eps, profile = charge.get("epsilon"), charge.get("profile_epsilon")
    if eps is None or not isinstance(profile, int | float) or isinstance(profile, bool):
        return eps
    return float(eps) + float(profile)


def as_store(store: ReleaseStore | str) -> ReleaseStore:
    """``store`` opened: the run's own store passed down (opened once per run and process), or a URL
    opened here (a task on a Dask worker gets the URL)."""
    return store if isinstance(store, ReleaseStore) else ReleaseStore(store)


def open_store(url: str, storage_options: dict[str, Any] | None = None) -> ReleaseStore:
    return ReleaseStore(url, storage_options)


def resolve_release(target: str, storage_options: dict[str, Any] | None = None) -> tuple[ReleaseStore, str]:
    """A store and the relative path of one committed version, from what a user typed.

    Accepts a version URL (``.../releases/<dataset>/<city>/<period>/v<N>``), or a store root holding
    exactly one committed release (the core CLI's ``--out DIR``).
    """
    t = str(target).rstrip("/")
    m = re.match(r"^(.*?)/?(releases/[^/]+/[^/]+/[^/]+/v\d+)$", t)
    if m:
        store = ReleaseStore(m.group(1) or ".", storage_options, create=False)  # a read never makes a store
        if not store.exists(f"{m.group(2)}/{MANIFEST}"):
            raise StoreError(f"no committed release at {t} (no {MANIFEST}; uncommitted versions do not exist)")
        return store, m.group(2)
    if "://" not in t and not Path(t).exists():
        raise StoreError(f"release {t!r} not found")
    store = ReleaseStore(t, storage_options, create=False)
    found = store.list_releases()
    if not found:
        raise StoreError(f"{t} holds no committed release")
    if len(found) > 1:
        listing = "\n  ".join(str(r.url) for r in found[:20])
        raise StoreError(f"{t} holds {len(found)} releases; name one of them:\n  {listing}")
    r = found[0]
    return store, ReleaseRef(r.dataset, r.city, r.period, r.version).rel


def fetch_to_temp(target: str, storage_options: dict[str, Any] | None = None) -> tuple[Manifest, Path]:
    """Resolve, download and verify a release into a fresh temporary folder (caller removes it)."""
    store, rel = resolve_release(target, storage_options)
    return store.fetch(rel, tempfile.mkdtemp(prefix="geodp-release-"))
