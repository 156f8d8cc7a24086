"""`python benchmarks/peer.py multi-label` (the peer's GoEmotions fine-tuning) under the name benchmarks/multi_label.py
runs, and imports `read_tsv` from: `python benchmarks/multi_label_peer.py --model DIR --data-dir DIR --seeds 0,1`."""

import sys

from peer import main, read_tsv  # noqa: F401  (read_tsv: the texts as the peer reads them, for multi_label.py)

if __name__ == "__main__":
    sys.exit(main(["multi-label", *sys.argv[1:]]))
