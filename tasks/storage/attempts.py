"""The attempt protocol of a release version: stage an attempt beside the charge that pays for it,
seal an attempt another run of the same charge holds, delete an attempt's noisy files, find the
complete one. Mixed into :class:`tasks.storage.store.ReleaseStore`, whose create-only objects it uses."""

from __future__ import annotations

import json
from pathlib import Path

from tasks.storage.objects import (
    CHARGE_REF,
    MANIFEST,
    SEALED,
    STAGED,
    AttemptSealed,
    IntegrityError,
    ReleaseRef,
    StagedElsewhere,
    StoreError,
    sha256_bytes,
    utc_now,
)


class AttemptProtocol:
    """Attempts under ``v<N>/<attempt>/`` of one store (see tasks/storage/store.py's layout)."""

    def stage(self, ref: ReleaseRef, local_dir: str | Path, names: list[str], attempt: str,
              charge_ref: bytes | None, supersedes: tuple[str, ...] = ()) -> tuple[str, list[dict]]:
        """Upload a new attempt under v<N>/<attempt>/: its charge reference first, then the noisy files,
        then its _STAGED.json (file list and hashes).

        ``charge_ref`` (``charge.json``) names the ledger charge that pays for the noise; writing it
        first means every noisy object in the store sits beside the charge that covers it. Attempts
        named in ``supersedes`` hold the same charge for an earlier run that died (or is too slow):
        each is *sealed* (a tombstone ``_STAGED.json`` that its writer can no longer create) and its
        noisy files are deleted before this attempt uploads any noise. Raises :class:`StagedElsewhere`
        when a superseded attempt turns out to be complete (commit that one), and
        :class:`AttemptSealed` when a newer run of the same charge sealed this attempt first (its
        files are deleted before the error is raised).
        """
        for other in supersedes:
            self.seal_attempt(ref, other)
            # its writer may still be alive and add a file after this delete: that writer then fails
            # at its sealed _STAGED.json and deletes its own files, so a file that reappears is left to it
            self.delete_attempt_data(ref, other, live_writer_may_remain=True)
        if self.exists(f"{ref.rel}/{attempt}/{STAGED}"):
            raise AttemptSealed(f"{self.url_of(ref.rel)}/{attempt} was taken over by a newer run of the same release")
        files = []
        try:
            if charge_ref is not None:
                self._create_or_same(f"{ref.rel}/{attempt}/{CHARGE_REF}", charge_ref)
                files.append(self._entry(CHARGE_REF, f"{attempt}/{CHARGE_REF}", charge_ref))
            for name in (n for n in names if n != CHARGE_REF or charge_ref is None):
                data = (Path(local_dir) / name).read_bytes()
                path = f"{attempt}/{name}"
                self._create_or_same(f"{ref.rel}/{path}", data)
                files.append(self._entry(name, path, data))
                if self._is_sealed(ref, attempt):
                    # a newer run sealed this attempt while this file went up: it goes at once, not at the
                    # end of the upload (a writer that dies before then leaves it to DatasetLedger sweeps)
                    raise StoreError("sealed mid-upload")
            self.create(f"{ref.rel}/{attempt}/{STAGED}", json.dumps({"files": files}, indent=2).encode())
        except OSError:
            # a newer run sealed this attempt mid-upload (and may have deleted a file being written)
            if not self._is_sealed(ref, attempt):
                raise
            self.delete_attempt_data(ref, attempt)
            raise AttemptSealed(f"{self.url_of(ref.rel)}/{attempt} was taken over by a newer run of the same "
                                "release; its files are deleted") from None
        return attempt, files

    def _create_or_same(self, rel: str, data: bytes) -> None:
        """Create an object of this run's attempt; one already there with the same bytes is the upload
        of an earlier try of the same task (a retry re-stages the same synopsis)."""
        try:
            self.create(rel, data)
        except FileExistsError:
            if self.read(rel, cache=False) != data:
                raise StoreError(f"{self.url_of(rel)} already holds other content; not staged") from None

    @staticmethod
    def _entry(name: str, path: str, data: bytes) -> dict:
        return {"name": name, "path": path, "sha256": sha256_bytes(data), "size": len(data)}

    def seal_attempt(self, ref: ReleaseRef, attempt: str) -> None:
        """Make ``attempt`` unable to complete (create-only tombstone ``_STAGED.json``). Raises
        :class:`StagedElsewhere` when it completed first."""
        try:
            self.create(f"{ref.rel}/{attempt}/{STAGED}", json.dumps({SEALED: True, "at": utc_now()}).encode())
            return
        except FileExistsError:
            pass
        if not self._is_sealed(ref, attempt):
            raise StagedElsewhere(attempt)

    def _is_sealed(self, ref: ReleaseRef, attempt: str) -> bool:
        try:
            return bool(self.read_json(f"{ref.rel}/{attempt}/{STAGED}").get(SEALED))
        except FileNotFoundError:
            return False

    def attempt_data(self, ref: ReleaseRef, attempt: str) -> list[str]:
        """The files of an attempt that may hold noise (everything but its charge reference and seal)."""
        prefix = f"{ref.rel}/{attempt}"
        try:
            with self._io("list", prefix):
                self.fs.invalidate_cache(self.path(prefix))
                found = self.fs.find(self.path(prefix))
        except FileNotFoundError:
            return []
        names = [f.rstrip("/")[len(self.path(prefix)) + 1:] for f in found]
        # a temporary file a killed writer left (local stores) holds noise too
        return sorted(n for n in names if n and n not in (CHARGE_REF, STAGED))

    def delete_attempt_data(self, ref: ReleaseRef, attempt: str, live_writer_may_remain: bool = False) -> list[str]:
        """Delete an uncommitted attempt's noisy files, keeping its charge reference and seal (so its
        charge stays known and its writer cannot complete it later). Returns the files still there
        afterwards: with ``live_writer_may_remain`` (a sealed attempt whose writer may still be
        uploading, under the same charge: that writer deletes what it adds) they may be some; otherwise
        any is a StoreError."""
        for name in self.attempt_data(ref, attempt):
            try:
                with self._io("delete", f"{ref.rel}/{attempt}/{name}"):
                    self.fs.rm_file(self.path(f"{ref.rel}/{attempt}/{name}"))
            except FileNotFoundError:
                pass
        # a temporary file that appears meanwhile is a live writer's, which removes it itself
        left = [n for n in self.attempt_data(ref, attempt) if not n.rsplit("/", 1)[-1].startswith(".tmp-")]
        if left and not live_writer_may_remain:
            raise StoreError(f"{self.url_of(ref.rel)}/{attempt} still holds {', '.join(left)} after deleting it")
        return left

    def attempts(self, ref: ReleaseRef) -> list[str]:
        """Every attempt folder of a version, complete or not."""
        return [n for n in self.listdir(ref.rel) if n.startswith("a-")]

    def attempts_of_charge(self, ref: ReleaseRef, seq: int) -> list[str]:
        """Attempts of this version staged (or begun) under ledger entry ``seq``: their charge
        reference names it."""
        out = []
        for attempt in self.attempts(ref):
            try:
                paid = self.read_json(f"{ref.rel}/{attempt}/{CHARGE_REF}")
            except FileNotFoundError:
                continue
            if isinstance(paid, dict) and paid.get("seq") == seq:
                out.append(attempt)
        return out

    def staged_attempt(self, ref: ReleaseRef) -> tuple[str, list[dict]] | None:
        """A complete, verified attempt of this version left by a run that died before its manifest."""
        for attempt in self.attempts(ref):
            try:
                staged = self.read_json(f"{ref.rel}/{attempt}/{STAGED}")
            except FileNotFoundError:
                continue
            if staged.get(SEALED):
                continue
            try:
                for f in staged["files"]:
                    self._verified(ref.rel, f)
            except (IntegrityError, FileNotFoundError, KeyError, TypeError):
                continue
            return attempt, staged["files"]
        return None

    def sweep_committed(self, dataset: str) -> list[str]:
        """Delete the noisy files of every attempt of a committed version but the committed one: they can
        never be published, and the charge that paid for the commit covers nothing else. A writer that
        stalled, was sealed by a newer run and uploaded into its sealed attempt before dying leaves such
        files; so does a race loser that died. Each is sealed first (so its writer, if alive, stops).
        One listing of the dataset's releases; returns the URLs of the files deleted."""
        root = self.path(f"releases/{dataset}")
        try:
            with self._io("list", f"releases/{dataset}"):
                self.fs.invalidate_cache(root)
                found = self.fs.find(root)
        except FileNotFoundError:
            return []
        committed, noisy = set(), {}
        for path in found:
            parts = path[len(self.root) + 1:].split("/")  # releases/<ds>/<city>/<period>/v<N>/...
            if len(parts) == 6 and parts[5] == MANIFEST:
                committed.add(tuple(parts[2:5]))
            elif len(parts) > 6 and parts[5].startswith("a-") and parts[6] not in (CHARGE_REF, STAGED):
                noisy.setdefault(tuple(parts[2:5]), set()).add(parts[5])
        deleted = []
        for city, period, version in sorted(committed & set(noisy)):
            ref = ReleaseRef(dataset, city, period, int(version[1:]))
            try:  # which attempts the commit names (DatasetLedger.verify checks the manifest itself)
                body = json.loads(self.read(f"{ref.rel}/{MANIFEST}"))
                keep = {body.get("attempt")} | {str(f["path"]).split("/", 1)[0] for f in body.get("files", [])}
            except (ValueError, TypeError, KeyError, AttributeError):
                continue  # an unreadable manifest: nothing of its version is deleted
            for attempt in sorted(noisy[(city, period, version)] - keep):
                try:
                    self.seal_attempt(ref, attempt)
                except StagedElsewhere:
                    pass  # complete, and never to be committed: its files go all the same
                there = self.attempt_data(ref, attempt)
                left = self.delete_attempt_data(ref, attempt, live_writer_may_remain=True)
                deleted += [f"{self.url_of(ref.rel)}/{attempt}/{n}" for n in there if n not in left]
        return deleted
