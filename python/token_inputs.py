"""How python/tokenize_hf.py reads its inputs: text and JSONL files, plain or compressed (.gz, .zst),
and Parquet files, in bounded pieces that end at line ends (a Parquet file's rows become JSONL
lines), so that memory stays bounded by the pieces in flight, not the file."""
import gzip
import io
import os
import json

try:  # *.zst inputs only
    import zstandard
    ZSTD_ERRORS = (zstandard.ZstdError,)
except ImportError:
    zstandard, ZSTD_ERRORS = None, ()
try:  # *.parquet inputs only
    import pyarrow
    import pyarrow.parquet as pyarrow_parquet
except ImportError:
    pyarrow, pyarrow_parquet = None, None


class InputError(Exception):
    """A problem with an input file, named in the message."""


COMPRESSIONS = (".gz", ".zst")


def uncompressed_name(path):
    return next((path[:-len(c)] for c in COMPRESSIONS if path.endswith(c)), path)


def is_parquet(path):
    return path.endswith(".parquet")


def is_jsonl(path):
    """Records, one document each: JSONL, and Parquet (read as JSONL pieces, a row per line)."""
    return uncompressed_name(path).endswith((".jsonl", ".ndjson")) or is_parquet(path)


def stem_of(path):
    return os.path.splitext(uncompressed_name(os.path.basename(path)))[0]


def missing_package(path, package):
    return InputError(f"tokenize_hf.py: reading {path} needs the Python package '{package}' (scripts/setup.sh installs "
                      f"it into .deps/python; or pip install {package})")


def open_input(path):
    if path.endswith(".gz"):
        return gzip.open(path, "rb")
    if path.endswith(".zst"):
        if zstandard is None:
            raise missing_package(path, "zstandard")
        return io.BufferedReader(ZstdFrames(path))
    return open(path, "rb")


class ZstdFrames(io.RawIOBase):
    """A .zst file's decompressed bytes, every frame in turn (pzstd and `cat a.zst b.zst` write
    several). A file that ends inside a frame raises EOFError: the zstandard package's own
    stream reader ends there silently, which would tokenize a cut-off file as if it were whole."""

    # Compressed bytes read at a time: what one read decompresses to (held until it is consumed)
    # grows with the compression ratio, so this stays small.
    READ_BYTES = 1 << 16

    def __init__(self, path):
        super().__init__()
        self._file = open(path, "rb")
        self._decompressor = zstandard.ZstdDecompressor()
        self._frame = self._decompressor.decompressobj()
        self._in_frame = False
        self._out = memoryview(b"")  # decompressed and not yet consumed (a view: no copy per read)

    def readable(self):
        return True

    def readinto(self, buffer):
        while not len(self._out):
            data = self._file.read(self.READ_BYTES)
            if not data:
                if self._in_frame:
                    raise EOFError("the file ends inside a zstd frame (it is cut short)")
                return 0
            parts = []
            while data:
                parts.append(self._frame.decompress(data))
                self._in_frame = not self._frame.eof
                data = self._frame.unused_data if self._frame.eof else b""
                if self._frame.eof:
                    self._frame = self._decompressor.decompressobj()
            self._out = memoryview(b"".join(parts))
        n = min(len(buffer), len(self._out))
        buffer[:n] = self._out[:n]
        self._out = self._out[n:]
        return n

    def close(self):
        self._file.close()
        super().close()


def valid_utf8(value):
    """Whether a pyarrow string scalar's bytes are UTF-8 (a null is)."""
    raw = value.cast(pyarrow.binary()).as_py() if value.is_valid else b""
    try:
        raw.decode("utf-8")
        return True
    except UnicodeDecodeError:
        return False


def parquet_pieces(path, chunk_bytes, field):
    """(first row, JSONL bytes, ends_document) pieces of a Parquet file's `field` column, in order."""
    if pyarrow_parquet is None:
        raise missing_package(path, "pyarrow")
    try:
        table = pyarrow_parquet.ParquetFile(path)
        if table.schema_arrow.names.count(field) > 1:
            raise InputError(f'{path} has {table.schema_arrow.names.count(field)} columns named "{field}" '
                             f"(--jsonl-field names the column that holds the text)")
        column = table.schema_arrow.get_field_index(field)
        if column < 0:
            raise InputError(f'{path} has no column "{field}" (--jsonl-field names the column that holds the text; '
                             f"it has {', '.join(table.schema_arrow.names)})")
        kind = table.schema_arrow.field(column).type
        if pyarrow.types.is_dictionary(kind):  # a categorical column: its values are what it holds
            kind = kind.value_type
        if not (pyarrow.types.is_string(kind) or pyarrow.types.is_large_string(kind)):
            raise InputError(f'{path}: column "{field}" holds {kind}, not strings')
        lines, size, first, row = [], 0, 1, 0
        for batch in table.iter_batches(batch_size=1024, columns=[field]):
            try:
                texts = batch.column(0).to_pylist()
            except UnicodeDecodeError as e:  # Parquet does not check that its strings are UTF-8
                bad = next(k for k, v in enumerate(batch.column(0)) if not valid_utf8(v))
                raise InputError(f'{path}:{row + bad + 1}: column "{field}" is not valid UTF-8 ({e.reason}); '
                                 f"text inputs must be UTF-8") from None
            for text in texts:
                row += 1
                if text is None:
                    raise InputError(f'{path}:{row}: column "{field}" is null (no text)')
                line = json.dumps({field: text}, ensure_ascii=False).encode("utf-8") + b"\n"
                lines.append(line)
                size += len(line)
                if size >= chunk_bytes:
                    yield first, b"".join(lines), False
                    lines, size, first = [], 0, row + 1
    except (OSError, pyarrow.ArrowException) as e:  # not Parquet, cut short, a corrupt page
        raise InputError(f"cannot read {path} as Parquet: {e}")
    yield first, b"".join(lines), True


def is_separator(line):
    """A line that is exactly a form feed (with "\\n", "\\r\\n" or nothing after it) ends a document."""
    content = line[:-1] if line.endswith(b"\n") else line
    return (content[:-1] if content.endswith(b"\r") else content) == b"\f"


def cut_is_safe(prev_line, line):
    """A document may be cut between prev_line and line: prev_line ends in a non-space character and
    a newline, line starts with a non-space character (Unicode spaces included)."""
    if not prev_line.endswith(b"\n"):
        return False
    last = prev_line[-5:-1].decode("utf-8", "replace")[-1:]  # a character takes at most 4 bytes
    first = line[:4].decode("utf-8", "replace")[:1]
    return last != "" and first != "" and not last.isspace() and not first.isspace()


def pieces(path, chunk_bytes, cut_inside_documents, field="text"):
    """(first line number, bytes, ends_document) pieces of an input, in order, each ending at a line end.

    JSONL pieces end after any line. Text pieces end after a separator line or, where allowed, at a
    safe cut inside a document; the last piece ends the file's last document (ends_document).
    """
    if is_parquet(path):
        yield from parquet_pieces(path, chunk_bytes, field)
        return
    jsonl = is_jsonl(path)
    lines, size, first, number = [], 0, 1, 0
    pending = None  # the previous piece, yielded once it is known not to be the last
    try:
        with open_input(path) as f:
            for line in f:
                number += 1
                if size >= chunk_bytes and (jsonl or (cut_inside_documents and cut_is_safe(lines[-1], line))):
                    if pending:
                        yield pending
                    pending, lines, size, first = (first, b"".join(lines), False), [], 0, number
                lines.append(line)
                size += len(line)
                if size >= chunk_bytes and not jsonl and is_separator(line):
                    if pending:
                        yield pending
                    pending, lines, size, first = (first, b"".join(lines), False), [], 0, number + 1
    except (OSError, EOFError, *ZSTD_ERRORS) as e:  # also a corrupt or truncated .gz or .zst
        raise InputError(f"cannot read {path} (after line {number}): {e}")
    if pending:
        yield pending
    yield first, b"".join(lines), True
