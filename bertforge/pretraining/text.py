"""Reading pre-training text as a stream of documents, each a list of sentences.

Three input formats, chosen per file (`--input-format`, default `auto`):

- `bert`: Google's own format (`sample_text.txt`): one sentence per line, a blank line between
  documents. Lines are taken as they are; every file starts a new document (Google's reader
  would run the last document of one file into the first of the next).
- `wiki`: WikiExtractor output: `<doc id=... title=...>` ... `</doc>` per article. The `<doc>`
  lines and the repeated title line (the first non-empty line, when it equals the `title`
  attribute) are dropped; every other non-empty line is a paragraph, split into sentences.
- `text`: plain running text (a book): the whole file is ONE document. Paragraphs are found, then
  split into sentences. A file is *hard-wrapped* when 90 % of its non-empty lines are at most 100
  characters long (Gutenberg wraps at ~70; a one-paragraph-per-line novel has most lines far
  longer): then the lines of a blank-line-separated block are joined with spaces into one
  paragraph. Otherwise every line is a paragraph.

`auto` rule, on the first 64 KiB of the file:
  1. the first non-empty line starts with `<doc ` -> `wiki`;
  2. else `bert` when all of: at least 75 % of the non-empty lines end in sentence punctuation
     (`.`, `!`, `?`, `…`, possibly followed by closing quotes/brackets); at most 15 % of them are
     split into several sentences by the sentence splitter (a BERT line *is* one sentence, a
     paragraph is not); and the blank-line-separated blocks average at least two lines (BERT's
     blocks are documents of several sentences, whereas a book with a blank line after every
     paragraph has one-line blocks);
  3. else `text`.
  On the shipped corpus this gives `bert` for sample_text.txt (87 % / 6 % / 10.3 lines), `wiki` for
  the 20 WikiExtractor files and `text` for all 45 books (the closest, TinyShakespeare, has only
  29 % of its lines ending a sentence). Force the format when your files defeat the heuristic.

Sentence splitting: `blingfire` (Microsoft's finite-state-machine NLP library; the C++ engine is
inside the wheel, called through ctypes), chosen over the candidates compared on the 45 books (one call
per paragraph, one core; a sample of paragraphs for the quality of the boundaries):

    splitter               speed                      boundaries
    blingfire              fast (native code)         dialogue split correctly, most abbreviations kept
    sentencex              fastest                    never splits inside quotation marks
    syntok                 slow (pure Python)         the best
    nltk punkt, untrained  middling                   a sentence ends at every "Mr."
    pysbd                  slowest (pure Python)      few abbreviation errors; minutes for the books

nltk's punkt needs the pre-trained `punkt_tab` model, which no PyPI package ships reliably (the
`nltk-punkt` package downloads it at install time). sentencex is fast and maintained, but a novel's
multi-sentence speeches become single "sentences" longer than a whole 128-token instance, which
truncation then cuts. syntok has the best boundaries but is pure Python, an order of magnitude slower
than blingfire. blingfire splits dialogue correctly and keeps most abbreviations, at the cost of an
occasional "Mr. | Cassius" split (a harmless extra boundary for BERT's segments).
Caveats: its wheel is `py3-none-any` with x86-64 binaries only (Linux, Windows, Intel macOS), and
it installs tokenizer models this module does not use.
"""

from __future__ import annotations

import codecs
import functools
import html
import os
import re
from pathlib import Path
from typing import Callable, Iterator

FORMATS = ("auto", "bert", "text", "wiki")

_SNIFF_BYTES = 64 * 1024
_SENTENCE_END = re.compile(r"""[.!?\u2026]["'\u201d\u2019)\]]*$""")
_DOC_TITLE = re.compile(r'title="([^"]*)"')
_WRAP_WIDTH = 100

Progress = Callable[[int], None]


@functools.lru_cache(maxsize=None)
def _blingfire():
    try:
        import blingfire  # optional extra (its binary ships for x86-64 only)
    except (ImportError, OSError) as error:  # not installed, or no binary for this platform (it ships x86-64 only)
        raise ModuleNotFoundError(f"sentence splitting needs the blingfire package ({error}); "
                                  "pip install blingfire, or give BERT-format input (--input-format bert)") from None
    return blingfire


def split_sentences(paragraph: str) -> list[str]:
    """Sentences of one paragraph (stripped, non-empty), by blingfire."""
    text = paragraph.replace("\n", " ").strip()
    if not text:
        return []
    out = _blingfire().text_to_sentences(text)
    if not out.strip():
        return [text]  # blingfire answers '' when its call fails: keep the text whole rather than lose it
    return [s for s in (part.strip() for part in out.split("\n")) if s]


def _sniff_lines(path: Path) -> list[str]:
    with open(path, encoding="utf-8", errors="replace") as handle:
        text = handle.read(_SNIFF_BYTES)
    lines = text.split("\n")
    if len(text) == _SNIFF_BYTES and len(lines) > 1:
        lines = lines[:-1]  # a cut line is not a line
    return lines


def looks_like_bert_format(lines: list[str]) -> bool:
    """The `auto` rule for Google's one-sentence-per-line format (see the module docstring)."""
    stripped = [line.strip() for line in lines]
    non_empty = [line for line in stripped if line]
    if not non_empty:
        return False
    if sum(1 for line in non_empty if _SENTENCE_END.search(line)) < 0.75 * len(non_empty):
        return False
    blocks, current = [], 0
    for line in stripped:
        if line:
            current += 1
        elif current:
            blocks.append(current)
            current = 0
    if current:
        blocks.append(current)
    if sum(blocks) < 2 * len(blocks):
        return False
    sample = non_empty[:400]
    multi = sum(1 for line in sample if len(split_sentences(line)) > 1)
    return multi <= 0.15 * len(sample)


def detect_format(path: str | os.PathLike) -> str:
    """`wiki`, `bert` or `text` for one file, by the `auto` rule of the module docstring."""
    lines = _sniff_lines(Path(path))
    first = next((line for line in lines if line.strip()), "")
    if first.lstrip().startswith("<doc "):
        return "wiki"
    return "bert" if looks_like_bert_format(lines) else "text"


def _bert_documents(path: Path, progress: Progress | None) -> Iterator[list[str]]:
    document: list[str] = []
    with open(path, encoding="utf-8", errors=COUNT_AND_REPLACE) as handle:
        for line in handle:
            if progress:
                progress(len(line))
            line = line.strip()
            if line:
                document.append(line)
            elif document:
                yield document
                document = []
    if document:
        yield document


def _wiki_documents(path: Path, progress: Progress | None) -> Iterator[list[str]]:
    document: list[str] | None = None
    title: str | None = None
    with open(path, encoding="utf-8", errors=COUNT_AND_REPLACE) as handle:
        for line in handle:
            if progress:
                progress(len(line))
            stripped = line.strip()
            if stripped.startswith("<doc ") or stripped == "<doc>":
                if document:
                    yield document  # an unclosed <doc>
                match = _DOC_TITLE.search(stripped)
                document, title = [], html.unescape(match.group(1)).strip() if match else None
                continue
            if stripped.startswith("</doc>"):
                if document:
                    yield document
                document, title = None, None
                continue
            if document is None or not stripped:
                continue  # text outside any <doc>, blank lines
            if title is not None:
                first, title = title, None
                if stripped == first:
                    continue  # the repeated title line
            document.extend(split_sentences(stripped))
    if document:
        yield document


def text_paragraphs(text: str) -> list[str]:
    """Paragraphs of running text: blocks of a hard-wrapped file joined, else one per line."""
    lines = [line.strip() for line in text.split("\n")]
    lengths = sorted(len(line) for line in lines if line)
    if not lengths:
        return []
    wrapped = lengths[max(0, int(0.9 * len(lengths)) - 1)] <= _WRAP_WIDTH
    if not wrapped:
        return [line for line in lines if line]
    paragraphs, block = [], []
    for line in lines:
        if line:
            block.append(line)
        elif block:
            paragraphs.append(" ".join(block))
            block = []
    if block:
        paragraphs.append(" ".join(block))
    return paragraphs


def _text_documents(path: Path, progress: Progress | None) -> Iterator[list[str]]:
    with open(path, encoding="utf-8", errors=COUNT_AND_REPLACE) as handle:
        text = handle.read()
    sentences: list[str] = []
    for paragraph in text_paragraphs(text):
        sentences.extend(split_sentences(paragraph))
    if progress:
        progress(len(text))
    if sentences:
        yield sentences


_READERS = {"bert": _bert_documents, "wiki": _wiki_documents, "text": _text_documents}

# Bytes that are not UTF-8 become U+FFFD (a corpus scraped from the web has a few), but never
# silently: this codec error handler counts them, per process, for `replaced_bytes`.
COUNT_AND_REPLACE = "bertforge.count_and_replace"
_replaced = [0]


def _count_and_replace(error: UnicodeDecodeError) -> tuple[str, int]:
    _replaced[0] += error.end - error.start
    return "\ufffd", error.end


codecs.register_error(COUNT_AND_REPLACE, _count_and_replace)


def replaced_bytes() -> int:
    """Undecodable bytes this process has replaced with U+FFFD while reading documents so far."""
    return _replaced[0]


def check_utf8(path: str | os.PathLike, chunk_size: int = 1 << 20) -> None:
    """ValueError naming the file, line and byte offset of the first byte that is not UTF-8 (what
    `prepare-pretraining --strict` runs on every input before any work). Reads in chunks: a corpus
    file may be larger than memory."""
    decoder = codecs.getincrementaldecoder("utf-8")()
    offset, line = 0, 1  # bytes and lines before `buffer`
    with open(path, "rb") as handle:
        while True:
            chunk = handle.read(chunk_size)
            pending = decoder.getstate()[0]
            buffer = pending + chunk
            try:
                decoder.decode(chunk, final=not chunk)
            except UnicodeDecodeError as error:
                at = offset - len(pending) + error.start
                where = line + buffer.count(b"\n", 0, error.start)
                raise ValueError(f"{path}:{where}: not UTF-8 text (byte 0x{buffer[error.start]:02x} at byte offset "
                                 f"{at}); re-save it as UTF-8, or drop --strict to replace such bytes") from None
            if not chunk:
                return
            line += chunk.count(b"\n")
            offset += len(chunk)


def read_documents(path: str | os.PathLike, input_format: str = "auto",
                   progress: Progress | None = None) -> Iterator[list[str]]:
    """Documents of one file, one at a time, each a list of sentence strings.

    `progress(n)` is called with the number of characters consumed as the file is read.
    """
    path = Path(path)
    if input_format not in FORMATS:
        raise ValueError(f"input format must be one of {', '.join(FORMATS)}, got {input_format!r}")
    if not path.is_file():
        raise FileNotFoundError(f"pre-training input not found: {path}")
    fmt = detect_format(path) if input_format == "auto" else input_format
    return _READERS[fmt](path, progress)
