"""Reading a store's KV files one chunk at a time, each chunk checked against the checksum the manifest keeps.

A KV file is a safetensors file: an 8-byte little-endian header length, a JSON header naming every tensor's dtype,
shape and byte range, then the tensors' bytes. A chunk `i` is the tensors named `{i}.<what>`; its checksum is a
digest of their names, dtypes, shapes and bytes as stored, in name order, so it covers exactly what `load_chunk`
reads and can be computed from the file alone (`chunk_checksums`) without PyTorch.

The digest is XXH3-128, written `xxh3-128:<32 hex digits>`: it guards against damage (a bit flipped, a file cut
short or overwritten), not against tampering, and it is computed at memory speed, where SHA-256 was most of a
large document's load (docs/speed.md). A checksum without a prefix is the SHA-256 hex digest stores
written before recorded; it is checked as SHA-256, so those stores read and verify as they are.
"""

from __future__ import annotations

import hashlib
import json
import mmap
import os
import struct
from pathlib import Path

import xxhash

# safetensors dtype names and their sizes in bytes
_ITEMSIZE = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1, "BOOL": 1}
_MAX_HEADER = 100 << 20
_REMOTE_HEAD = 64 << 10  # bytes fetched at once for a remote file's header
CHECKSUM = "xxh3-128"  # what new checksums are; `_digest`
# a local file's chunks are read as views of the file memory-mapped, not copied into new buffers, which loaded
# more slowly (benchmarks/load_place.py --reads mmap,copy; docs/speed.md)
MEMORY_MAP = True
Buffer = bytearray | memoryview  # a tensor's bytes as read


def _digest(like: str | None = None):
    """A new digest of the algorithm `like` (a recorded checksum) was computed with: XXH3-128 for one that names
    it, SHA-256 for a bare hex digest (stores written before XXH3); XXH3-128 when `like` is None."""
    if like is None or like.startswith(CHECKSUM + ":"):
        return _Named(xxhash.xxh3_128())
    return hashlib.sha256()


class _Named:
    """A digest whose hexdigest names its algorithm: `xxh3-128:<hex>`."""

    def __init__(self, digest):
        self.digest = digest
        self.update = digest.update

    def hexdigest(self) -> str:
        return f"{CHECKSUM}:{self.digest.hexdigest()}"


class DamagedFile(Exception):
    """A KV file that does not parse, or a chunk whose tensors are missing or do not match their checksum."""


class KVFile:
    """One KV file's header, read once; its chunks' bytes are read on demand."""

    def __init__(self, path: Path | str | bytes, fs=None):
        # `fs`: an fsspec filesystem holding `path` (a store at a URL); None for a local file; `path` may also be
        # the file's bytes, as a writer holds them before writing
        self.fs = fs
        self._data = bytes(path) if isinstance(path, (bytes, bytearray)) else None
        self.path = path if fs is not None or self._data is not None else Path(path)
        try:
            if fs is not None:  # one request for the header (and a second only for a header past 64 KiB)
                head = fs.cat_file(path, start=0, end=_REMOTE_HEAD)
                (length,) = struct.unpack("<Q", head[:8]) if len(head) >= 8 else (None,)
                if length is None:
                    raise DamagedFile("shorter than a safetensors header")
                if length > _MAX_HEADER:
                    raise DamagedFile("header length out of range")
                header = head[8:8 + length] if len(head) >= 8 + length else fs.cat_file(path, start=8, end=8 + length)
                if len(header) != length:
                    raise DamagedFile("header cut short")
                size = None  # not asked for: a tensor past the end is found when it is read
            else:
                with self._open() as f:
                    raw = f.read(8)
                    if len(raw) != 8:
                        raise DamagedFile("shorter than a safetensors header")
                    (length,) = struct.unpack("<Q", raw)
                    if length > _MAX_HEADER:
                        raise DamagedFile("header length out of range")
                    header = f.read(length)
                    if len(header) != length:
                        raise DamagedFile("header cut short")
                    size = len(self._data) if self._data is not None else self.path.stat().st_size
        except FileNotFoundError:
            raise DamagedFile("missing") from None
        except OSError as exc:
            raise DamagedFile(exc.strerror or type(exc).__name__) from None
        try:
            entries = json.loads(header)
        except ValueError:
            raise DamagedFile("header is not JSON") from None
        if not isinstance(entries, dict):
            raise DamagedFile("header is not a JSON object")
        self.metadata = entries.pop("__metadata__", None) or {}
        self.data_start = 8 + length
        self.tensors: dict[str, tuple[str, list[int], int, int]] = {}
        for name, entry in entries.items():
            try:
                dtype, shape, (begin, end) = entry["dtype"], [int(n) for n in entry["shape"]], entry["data_offsets"]
                count = 1
                for n in shape:
                    count *= n
                ok = dtype in _ITEMSIZE and 0 <= begin <= end and end - begin == count * _ITEMSIZE[dtype]
            except (KeyError, TypeError, ValueError):
                ok = False
            if not ok or (size is not None and self.data_start + end > size):
                raise DamagedFile(f"tensor {name} has a bad header entry or lies past the end of the file")
            self.tensors[name] = (dtype, shape, begin, end)

    def _open(self):
        if self._data is not None:
            import io

            return io.BytesIO(self._data)
        if self.fs is None:
            return open(self.path, "rb")
        # no read-ahead: a chunk is a few byte ranges of a file that may hold many chunks
        return self.fs.open(self.path, "rb", cache_type="none")

    def chunk_names(self, idx: int) -> list[str]:
        """The names of chunk `idx`'s tensors in this file, in name order."""
        prefix = f"{idx}."
        return sorted(n for n in self.tensors if n.startswith(prefix))

    def read_chunk(self, idx: int, like: str | None = None) -> tuple[dict[str, tuple[str, list[int], Buffer]], str]:
        """Chunk `idx`'s tensors as `{name: (dtype, shape, bytes)}` and their checksum, computed as the recorded
        checksum `like` was (`_digest`)."""
        result = self.read_chunks([idx], {idx: like})[idx]
        if isinstance(result, DamagedFile):
            raise result
        return result

    def read_chunks(self, indices, like: dict[int, str | None] | None = None
                    ) -> dict[int, tuple[dict[str, tuple[str, list[int], Buffer]], str] | DamagedFile]:
        """`read_chunk` of each chunk of `indices`, their tensors fetched in one read (on object storage, one
        batch of range requests): per chunk its tensors and checksum (computed as `like[idx]`, the checksum
        recorded for it, was; new checksums where none is given), or the `DamagedFile` that says why not.
        An unreadable file is a `DamagedFile` raised."""
        names = {idx: self.chunk_names(idx) for idx in indices}
        wanted = [n for idx in names for n in names[idx]]
        try:
            bufs = dict(zip(wanted, self._read([self.tensors[n][2:] for n in wanted])))
        except FileNotFoundError:
            raise DamagedFile("missing") from None
        except OSError as exc:
            raise DamagedFile(exc.strerror or type(exc).__name__) from None
        out: dict = {}
        for idx, chunk_names in names.items():
            tensors, digest = {}, _digest((like or {}).get(idx))
            for name in chunk_names:
                dtype, shape, begin, end = self.tensors[name]
                if len(bufs[name]) != end - begin:
                    out[idx] = DamagedFile(f"tensor {name} cut short")
                    break
                _update(digest, name, dtype, shape, bufs[name])
                tensors[name] = (dtype, shape, bufs[name])
            else:
                out[idx] = (tensors, digest.hexdigest())
        return out

    def _read(self, spans: list[tuple[int, int]]) -> list[Buffer]:
        """The bytes of each (begin, end) of the data section: views of a local file memory-mapped (`_mapped`; where
        `MEMORY_MAP` is set), else read into new buffers. A remote file's spans are merged where they touch
        and fetched in one concurrent batch of range requests."""
        if self.fs is None and self._data is None and MEMORY_MAP:
            return self._mapped(spans)
        if self.fs is None:
            bufs = []
            with self._open() as f:
                for begin, end in spans:
                    buf = bytearray(end - begin)
                    f.seek(self.data_start + begin)
                    got = f.readinto(buf)
                    bufs.append(buf if got == len(buf) else buf[:got])
            return bufs
        runs: list[list[int]] = []  # [begin, end] of each merged run, in order
        for begin, end in sorted(spans):
            if runs and begin <= runs[-1][1]:
                runs[-1][1] = max(runs[-1][1], end)
            else:
                runs.append([begin, end])
        fetched = self.fs.cat_ranges([self.path] * len(runs), [self.data_start + b for b, _ in runs],
                                     [self.data_start + e for _, e in runs], on_error="raise")
        for data in fetched:
            if isinstance(data, BaseException):
                raise data
        bufs = []
        for begin, end in spans:  # the run that holds the span: the last that starts at or before it
            at = max(i for i, (b, _) in enumerate(runs) if b <= begin)
            b = runs[at][0]
            bufs.append(bytearray(fetched[at][begin - b:end - b]))
        return bufs

    def _mapped(self, spans: list[tuple[int, int]]) -> list[memoryview]:
        """The bytes of each span as views of the file memory-mapped copy-on-write: the page cache's own pages,
        not a copy of them, and writable for `to_torch` without a write ever reaching the file. The map lives
        while a view or a tensor over one does. A span past the end of a file cut short since its header was
        read comes back short, as `read_chunks` expects."""
        with open(self.path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY) if size else b""
        view = memoryview(mapped)
        return [view[min(self.data_start + begin, size):min(self.data_start + end, size)] for begin, end in spans]

    def checksum(self, idx: int, like: str | None = None) -> str:
        """Chunk `idx`'s checksum as it is now: computed as `like` (a recorded checksum) was, else a new one."""
        return self.read_chunk(idx, like)[1]


def _update(digest, name: str, dtype: str, shape: list[int], data) -> None:
    digest.update(f"{name}\0{dtype}\0{','.join(map(str, shape))}\0{len(data)}\0".encode())
    digest.update(data)


def to_torch(dtype: str, shape: list[int], data: Buffer):
    """A tensor over `data` (no copy), as safetensors would load it."""
    import torch

    torch_dtype = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
                   "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
                   "BOOL": torch.bool}[dtype]
    if not data:
        return torch.empty(shape, dtype=torch_dtype)
    return torch.frombuffer(data, dtype=torch_dtype).reshape(shape)


def chunk_checksums(path: Path | str | bytes, indices, required: tuple[str, ...], fs=None) -> dict[int, str | None]:
    """The checksum of each chunk of `indices` in the KV file at `path` (on `fs`, if given; or in these bytes) as it
    is now; None for a chunk that lacks one of the `required` tensors (`{i}.<required>`), all None when the file
    does not parse."""
    try:
        file = KVFile(path, fs)
    except DamagedFile:
        return {i: None for i in indices}
    result = {}
    for i in indices:
        try:
            complete = all(f"{i}.{what}" in file.tensors for what in required)
            result[i] = file.checksum(i) if complete else None
        except DamagedFile:
            result[i] = None
    return result
