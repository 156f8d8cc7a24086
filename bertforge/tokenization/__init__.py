"""WordPiece tokenization exactly as Google's tokenization.py, on a fast and a reference backend."""

from .extend import extend_vocab
from .tokenizer import BertTokenizer, truncated_lengths
from .vocab import SPECIAL_TOKENS, load_vocab, train_vocab, vocab_fingerprint

__all__ = ["BertTokenizer", "SPECIAL_TOKENS", "extend_vocab", "load_vocab", "train_vocab", "truncated_lengths",
           "vocab_fingerprint"]
