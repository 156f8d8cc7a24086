"""train_vocab and load_vocab on a small real book (Alice in Wonderland, 144 kB).

The `tokenizers` WordPiece trainer adds the alphabet, then merges the most frequent pair of
pieces until the vocabulary has `vocab_size` tokens or no pair occurs `min_frequency` times; in
the second case the vocabulary is smaller than asked, and every word seen `min_frequency` times is
a token of its own. The alphabet is always kept whole, even where it alone exceeds `vocab_size`.
Left alone, the trainer numbers its "##" pieces in hash order and breaks ties between equally frequent
pairs by those numbers, so two processes could write different vocabularies; `train_vocab` numbers the
pieces up front and the result canonically, so the same text gives the same vocab.txt every time.
"""

from __future__ import annotations

import hashlib
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from bertforge.tokenization import SPECIAL_TOKENS, BertTokenizer, load_vocab, train_vocab, vocab_fingerprint
from bertforge.tokenization.reference import BasicTokenizer


@pytest.fixture(scope="module")
def book(shared_data) -> Path:
    return shared_data / "pretraining" / "books" / "Carroll_Alice_1865.txt"


@pytest.fixture(scope="module")
def word_counts(book) -> Counter:
    """The book's words as BertTokenizer splits them before WordPiece (lower-cased)."""
    basic = BasicTokenizer(do_lower_case=True)
    return Counter(word for line in book.read_text(encoding="utf-8").split("\n") for word in basic.tokenize(line))


def test_specials_first_and_requested_size(book, tmp_path):
    output = tmp_path / "vocab.txt"
    vocab = train_vocab([book], vocab_size=2000, output=output, show_progress=False)
    assert len(vocab) == 2000
    assert [token for token, _ in sorted(vocab.items(), key=lambda item: item[1])[:5]] == list(SPECIAL_TOKENS)
    assert sorted(vocab.values()) == list(range(2000))
    assert load_vocab(output) == vocab
    assert output.read_text(encoding="utf-8").split("\n")[:5] == list(SPECIAL_TOKENS)

    continuation = [token for token in vocab if token.startswith("##")]
    assert len(continuation) > 100 and all(len(token) > 2 for token in continuation)
    assert {"##s", "##ed", "##ing"} <= set(continuation)
    assert not any(c.isupper() for token in vocab if token not in SPECIAL_TOKENS for c in token)


def test_small_corpus_gives_fewer_tokens(book, word_counts):
    vocab = train_vocab([book], vocab_size=30_000, show_progress=False)
    assert len(SPECIAL_TOKENS) + len(set("".join(word_counts))) < len(vocab) < 30_000
    # It stopped because no pair of pieces is seen twice any more: every word seen twice is whole.
    assert all(word in vocab for word, count in word_counts.items() if count >= 2)
    assert any(word not in vocab for word, count in word_counts.items() if count == 1)

    # Below the size of the alphabet, the trainer keeps the whole alphabet anyway: more than asked.
    alphabet = set("".join(word_counts))
    tiny = train_vocab([book], vocab_size=6, show_progress=False)
    assert len(tiny) > 6 and alphabet <= set(tiny)
    assert all(tiny[token] == i for i, token in enumerate(SPECIAL_TOKENS))


def test_trained_vocab_covers_the_book(book, tmp_path):
    output = tmp_path / "vocab.txt"
    train_vocab([book], vocab_size=3000, output=output, show_progress=False)
    text = book.read_text(encoding="utf-8")
    fast, reference = BertTokenizer(output), BertTokenizer(output, backend="reference")
    tokens = fast.tokenize(text)
    assert "[UNK]" not in tokens  # every character of the book is in the alphabet
    assert tokens == reference.tokenize(text)
    assert any(token.startswith("##") for token in tokens)


def test_cased_training_keeps_case_and_accents(book, tmp_path):
    accented = tmp_path / "accents.txt"
    accented.write_text("Café Café Élan Élan naïve naïve\n" * 3, encoding="utf-8")
    vocab = train_vocab([book, accented], vocab_size=30_000, lowercase=False, output=tmp_path / "vocab.txt",
                        show_progress=False)
    assert {"Alice", "Café", "Élan"} <= set(vocab)
    tokenizer = BertTokenizer(tmp_path / "vocab.txt", do_lower_case=None)  # guessed from the vocabulary
    assert tokenizer.do_lower_case is False
    assert tokenizer.tokenize("Alice said Café") == ["Alice", "said", "Café"]

    uncased = train_vocab([accented], vocab_size=100, lowercase=True, show_progress=False)
    assert {"cafe", "elan", "naive"} <= set(uncased) and "Café" not in uncased


def test_training_errors(book, tmp_path):
    with pytest.raises(FileNotFoundError, match="missing.txt"):
        train_vocab([book, tmp_path / "missing.txt"], vocab_size=100, show_progress=False)
    with pytest.raises(ValueError, match="vocab_size"):
        train_vocab([book], vocab_size=5, show_progress=False)


def test_load_vocab_reads_a_directory_and_keeps_line_numbers(tmp_path):
    (tmp_path / "vocab.txt").write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\nhello  \n##lo\n", encoding="utf-8")
    vocab = load_vocab(tmp_path)
    assert vocab == {"[PAD]": 0, "[UNK]": 1, "[CLS]": 2, "[SEP]": 3, "[MASK]": 4, "hello": 5, "##lo": 6}


def test_vocab_fingerprint_of_a_file_a_mapping_and_a_token_list(book, tmp_path):
    path = tmp_path / "vocab.txt"
    vocab = train_vocab([book], vocab_size=300, output=path, show_progress=False)
    tokens = path.read_text(encoding="utf-8").splitlines()
    fingerprint = vocab_fingerprint(path)
    assert fingerprint == vocab_fingerprint(tmp_path) == vocab_fingerprint(vocab) == vocab_fingerprint(tokens)
    assert fingerprint == hashlib.sha256("\n".join(tokens).encode("utf-8")).hexdigest()[:16]
    swapped = tokens[:]
    swapped[5], swapped[6] = swapped[6], swapped[5]  # the same tokens, two ids exchanged
    assert vocab_fingerprint(swapped) != fingerprint
    assert vocab_fingerprint(tokens + ["extra"]) != fingerprint


def test_the_same_text_gives_the_same_vocab_file_in_every_process(book, tmp_path):
    """The trainer's own numbering differs between processes (its hash maps are seeded per process); two
    processes must still write identical files."""
    script = ("import sys; from bertforge.tokenization import train_vocab; "
              "train_vocab([sys.argv[1]], vocab_size=1500, output=sys.argv[2], show_progress=False)")
    outputs = [tmp_path / f"vocab{k}.txt" for k in range(3)]
    for output in outputs:
        subprocess.run([sys.executable, "-c", script, str(book), str(output)], check=True)
    first = outputs[0].read_bytes()
    assert all(output.read_bytes() == first for output in outputs[1:])
    tokens = first.decode("utf-8").split("\n")[:-1]
    assert tokens[:5] == list(SPECIAL_TOKENS)
    pieces = [k for k, token in enumerate(tokens) if token.startswith("##")]
    assert pieces == list(range(pieces[0], len(tokens))) and tokens[5:pieces[0]] == sorted(tokens[5:pieces[0]])
