"""Which files an input names: one file, a folder, a glob or a hive-partitioned folder, local or remote.

An input is resolved to a list of :class:`InputFile` before anything is read, so that partitions
outside a time window can be skipped without opening them, and so that the input's public identity
(:func:`source_version`: the files' count and latest modification time, never their content) is
known without reading data. Remote inputs (``s3://…``) go through fsspec; the S3 endpoint comes from
the environment as for the release store.
"""

from __future__ import annotations

import gzip
import io
import os
import re
from dataclasses import dataclass, field, replace
from datetime import UTC, date, datetime, timedelta
from typing import Any

from dpcore import GeoDPError


class DataError(GeoDPError, ValueError):
    """Bad input data. The message may describe private rows (counts, a row's number or values): it
    is for the operator's own terminal. ``public`` says what is wrong from public facts only (the
    input's locator, an option, the kind of problem), or is None where nothing can be said without
    private detail; what a Prefect run shows is built from it (tasks/public_errors.py)."""

    def __init__(self, message: str, public: str | None = None):
        super().__init__(message)
        self.public = public

    @classmethod
    def all_public(cls, message: str) -> DataError:
        """An error whose whole message is public (file names, options, listing metadata)."""
        return cls(message, public=message)

    def __reduce__(self):
        # a Dask worker pickles the error back to the client: ``public`` must travel with it
        return (type(self), (str(self), self.public))


FORMATS = ("parquet", "csv", "tsv", "snap")
_GLOB_CHARS = re.compile(r"[*?\[]")
_HIVE_PART = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)=(.*)$")
# Partition keys whose value is a UTC date (YYYY-MM-DD or YYYYMMDD); year=/month=/day= also combine.
DATE_KEYS = ("date", "day")


def storage_options_from_env(protocol: str) -> dict[str, Any]:
    """S3 endpoint from the environment, so the same command works against AWS, MinIO or moto.

    Three tries with the standard retry mode: a blip is retried, while an endpoint that refuses
    connections is reported in ~3 s instead of the legacy mode's ~11 s of back-off."""
    if protocol not in ("s3", "s3a"):
        return {}
    endpoint = os.environ.get("GEODP_S3_ENDPOINT_URL") or os.environ.get("AWS_ENDPOINT_URL_S3") \
        or os.environ.get("AWS_ENDPOINT_URL")
    opts: dict[str, Any] = {"config_kwargs": {"retries": {"max_attempts": 3, "mode": "standard"},
                                              "connect_timeout": 5}}
    if endpoint:
        opts["client_kwargs"] = {"endpoint_url": endpoint}
    return opts


def _protocol(url: str) -> str:
    return url.split("://", 1)[0].lower() if "://" in url else "file"


def normalised_locator(path: str | os.PathLike) -> str:
    """An input's public identity as one string: a local path or ``file://`` URL as its real absolute
    path (symlinks resolved), a remote URL as ``protocol://path`` without a trailing slash. A glob keeps
    its pattern (its fixed part resolved)."""
    text = str(path)
    protocol = _protocol(text)
    rest = text.split("://", 1)[1] if "://" in text else text
    if protocol in ("file", "local"):
        return os.path.realpath(os.path.expanduser(rest))
    return f"{protocol}://{rest.strip('/')}"


@dataclass(frozen=True)
class InputFile:
    path: str  # as the filesystem names it (absolute local path, or bucket/key)
    fmt: str
    size: int
    mtime: datetime  # UTC
    partition: dict[str, str] = field(default_factory=dict)  # hive key=value pairs above the file

    @property
    def name(self) -> str:
        return self.path.rsplit("/", 1)[-1]


@dataclass(frozen=True)
class InputSet:
    source: str  # the input as given
    fs: Any  # an fsspec filesystem
    local: bool
    files: list[InputFile]  # the files to read, in path order, after pruning
    n_pruned: int  # files skipped because their partition date lies outside the window

    def display(self, f: InputFile) -> str:
        """A file's name for messages: the local path, or the URL with its protocol."""
        return f.path if self.local else f"{_protocol(self.source)}://{f.path}"

    @property
    def version(self) -> str:
        return version_of(self.files)

    def within(self, window: tuple[int | None, int | None]) -> InputSet:
        """This listing narrowed to ``window`` (inside the window it was listed over): the files a listing
        over ``window`` keeps, without listing again (a backfill lists once for all its days)."""
        kept = [f for f in self.files if not _outside(partition_day(f.partition), window)]
        return replace(self, files=kept, n_pruned=self.n_pruned + len(self.files) - len(kept))

    def locators(self) -> list[str]:
        """The input's identity as the files it names: the normalised locator of the input itself and of
        every file it reads (a local file's real path, a remote file's URL). The same files reached
        another way (a ``file://`` URL, a symlink, the folder or a glob holding them) share the files'
        locators, so a ledger that binds them all to one dataset sees one source. A local file is also
        named by its device and inode (``inode:<dev>:<ino>``), so a hard link under another name is the
        same source; a copy is a new file and is not. Listing metadata only."""
        protocol = _protocol(self.source)
        files = [os.path.realpath(f.path) if self.local else f"{protocol}://{f.path}" for f in self.files]
        inodes = []
        for path in files if self.local else []:
            try:
                st = os.stat(path)
            except OSError:
                continue  # gone since it was listed: its reading fails with its own error
            inodes.append(f"inode:{st.st_dev}:{st.st_ino}")
        return sorted({normalised_locator(self.source), *files, *inodes})


def version_of(files: list[InputFile]) -> str:
    """Public identity of a set of files: their latest modification time (UTC, ISO 8601 basic form,
    microseconds after the dash) and their count. Letters, digits and dashes only, so that it can go
    into release keys and Prefect artifact keys as it is."""
    if not files:
        return "empty-0files"
    latest = max(f.mtime for f in files)
    return f"{latest:%Y%m%dT%H%M%S}-{latest:%f}Z-{len(files)}files"


def _mtime(info: dict, path: str) -> datetime:
    for key in ("mtime", "LastModified", "last_modified", "updated", "modified"):
        v = info.get(key)
        if v is None:
            continue
        if isinstance(v, int | float):
            return datetime.fromtimestamp(float(v), tz=UTC)
        if isinstance(v, datetime):
            return v.astimezone(UTC) if v.tzinfo else v.replace(tzinfo=UTC)
        if isinstance(v, str):
            try:
                d = datetime.fromisoformat(v.replace("Z", "+00:00"))
            except ValueError:
                continue
            return d.astimezone(UTC) if d.tzinfo else d.replace(tzinfo=UTC)
    raise DataError.all_public(f"cannot tell when {path} was last modified (its filesystem gives no time)")


def detect_format(name: str) -> str | None:
    """Format by file name; 'text' for .tsv/.txt, whose header decides between tsv and SNAP."""
    n = name.lower()
    if n.endswith((".parquet", ".pq")):
        return "parquet"
    if n.endswith((".csv", ".csv.gz")):
        return "csv"
    if n.endswith((".tsv", ".tsv.gz", ".txt", ".txt.gz")):
        return "text"
    return None


def _sniff_text(fs: Any, path: str, shown: str) -> str:
    """SNAP files are headerless TSV; a TSV with the standard header is read as CSV with tabs."""
    try:
        with fs.open(path, "rb") as raw:
            stream = gzip.GzipFile(fileobj=raw) if path.lower().endswith(".gz") else raw
            first = io.TextIOWrapper(stream, encoding="utf-8", errors="replace").readline()
    except (OSError, EOFError) as exc:
        raise DataError(f"cannot read {shown}: {exc}") from exc
    return "tsv" if "user_id" in first.split("\t")[0].lower() else "snap"


def _hive(rel_dirs: list[str]) -> dict[str, str]:
    out = {}
    for part in rel_dirs:
        m = _HIVE_PART.match(part)
        if m:
            out[m.group(1)] = m.group(2)
    return out


def _parse_day(text: str) -> date | None:
    for fmt in ("%Y-%m-%d", "%Y%m%d"):
        try:
            return datetime.strptime(text, fmt).date()
        except ValueError:
            pass
    return None


def partition_day(partition: dict[str, str]) -> date | None:
    """The UTC day a hive partition holds, or None when its keys do not name one (it is then read)."""
    for key in DATE_KEYS:
        if key in partition:
            d = _parse_day(partition[key])
            if d is not None:
                return d
    try:
        return date(int(partition["year"]), int(partition["month"]), int(partition["day"]))
    except (KeyError, ValueError):
        return None


def _outside(day: date | None, window: tuple[int | None, int | None] | None) -> bool:
    """True when the whole UTC day lies outside [start, end)."""
    if day is None or window is None:
        return False
    start_s, end_s = window
    d0 = int(datetime(day.year, day.month, day.day, tzinfo=UTC).timestamp())
    d1 = d0 + int(timedelta(days=1).total_seconds())
    return (start_s is not None and d1 <= start_s) or (end_s is not None and d0 >= end_s)


def _hidden(rel_parts: list[str]) -> bool:
    # Writers' bookkeeping (_SUCCESS, _metadata, _temporary/, .crc, .DS_Store) is not data.
    return any(p.startswith((".", "_")) for p in rel_parts)


def resolve_input(path: str | os.PathLike, fmt: str = "auto",
                  window: tuple[int | None, int | None] | None = None) -> InputSet:
    """List the files an input names (a file, a folder, a glob; local or ``s3://``), their formats and
    hive partitions, and skip the partitions whose date lies entirely outside ``window`` = (start_s,
    end_s), start ≤ t < end, either bound None. Opens no file except, for .tsv/.txt, the first line
    of the files kept (to tell a headed TSV from SNAP)."""
    import fsspec

    source = str(path)
    if fmt != "auto" and fmt not in FORMATS:
        raise DataError.all_public(f"unknown format {fmt!r}; use one of auto, {', '.join(FORMATS)}")
    protocol = _protocol(source)
    try:
        fs, root = fsspec.core.url_to_fs(source, **storage_options_from_env(protocol))
    except (ImportError, ValueError) as exc:
        raise DataError.all_public(f"cannot open {source!r}: {exc}") from exc
    local = protocol in ("file", "local")
    root = root.rstrip("/") or root
    try:
        entries, base, single = _list(fs, root, source)
    except DataError:
        raise
    except Exception as exc:  # network, permission and endpoint errors vary by filesystem
        # (an unreachable S3 endpoint is botocore's EndpointConnectionError, no OSError); the input's
        # location and why it cannot be listed are public: no file was read
        raise DataError.all_public(f"cannot list {source}: {_first_line(exc)}") from exc

    files, by_kind, n_pruned = [], {}, 0
    for p, info in entries:
        rel = p[len(base):].strip("/").split("/") if p.startswith(base + "/") else [p.rsplit("/", 1)[-1]]
        if not single and _hidden(rel):
            continue
        kind = fmt if fmt != "auto" else detect_format(rel[-1])
        shown = p if local else f"{protocol}://{p}"
        if kind is None:
            raise DataError.all_public(f"cannot tell the format of {shown}: use .parquet, .csv, .tsv or SNAP .txt(.gz), "
                             "or give --format")
        by_kind.setdefault("text" if kind in ("tsv", "snap") else kind, []).append(shown)
        part = _hive(rel[:-1])
        if _outside(partition_day(part), window):
            n_pruned += 1
            continue
        files.append(InputFile(p, kind, int(info.get("size") or 0), _mtime(info, shown), part))
    if not by_kind:
        raise DataError.all_public(f"{source} holds no data files")
    if len(by_kind) > 1:
        kinds = ", ".join(f"{len(v)} {k}" for k, v in sorted(by_kind.items()))
        raise DataError.all_public(f"{source} mixes file formats ({kinds}); give one format per input")
    for i, f in enumerate(files):
        if f.fmt == "text":
            shown = f.path if local else f"{protocol}://{f.path}"
            files[i] = InputFile(f.path, _sniff_text(fs, f.path, shown), f.size, f.mtime, f.partition)
    if len({f.fmt for f in files}) > 1:
        raise DataError.all_public(f"{source} mixes headed TSV and headerless SNAP files; give one format per input")
    return InputSet(source, fs, local, files, n_pruned)


def resolve_files(path: str | os.PathLike, fmt: str = "auto",
                  window: tuple[int | None, int | None] | None = None) -> InputSet:
    """:func:`resolve_input`, refusing an input with no file left in ``window``."""
    return nonempty(resolve_input(path, fmt, window))


def nonempty(inp: InputSet) -> InputSet:
    """``inp``, refused when no file of it is left in the window it was listed over."""
    if not inp.files:
        # file names and counts of files are public listing metadata
        raise DataError.all_public(f"no partition of {inp.source} lies in the time window "
                                   f"({inp.n_pruned} file(s) outside it)")
    return inp


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0][:300]}" if lines else type(exc).__name__


def _first(item: tuple) -> Any:
    return item[0]


def _list(fs: Any, root: str, source: str) -> tuple[list[tuple[str, dict]], str, bool]:
    """[(path, info)] sorted by path, the folder that hive partition names are relative to, and
    whether the input is one named file."""
    if fs.exists(root):
        if fs.isdir(root):
            found = fs.find(root, detail=True)
            return sorted(((p, i) for p, i in found.items() if i.get("type") != "directory"), key=_first), root, False
        return [(root, fs.info(root))], root.rsplit("/", 1)[0], True
    if not _GLOB_CHARS.search(root):
        raise DataError.all_public(f"input file not found: {source}")
    matches = fs.glob(root, detail=True)
    out: dict[str, dict] = {}
    for p, info in matches.items():
        if info.get("type") == "directory":
            out.update({q: j for q, j in fs.find(p, detail=True).items() if j.get("type") != "directory"})
        else:
            out[p] = info
    if not out:
        raise DataError.all_public(f"no files match {source}")
    # Hive names are read below the glob's fixed prefix, e.g. data/ for data/date=*/*.parquet.
    fixed = root[:_GLOB_CHARS.search(root).start()].rsplit("/", 1)[0]
    return sorted(out.items(), key=_first), fixed, False


def source_version(path: str | os.PathLike, fmt: str = "auto",
                   window: tuple[int | None, int | None] | None = None) -> str:
    """Public identity of an input: the latest modification time (UTC) over the files a load with the
    same ``window`` reads, and their count, e.g. ``20240302T100000-123456Z-3files``. Never a function
    of the files' content or size: both depend on the private records. Lists files; opens none
    (except the first line of .tsv/.txt files, to tell their format)."""
    return resolve_input(path, fmt, window).version
