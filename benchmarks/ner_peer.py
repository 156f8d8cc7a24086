"""`python benchmarks/peer.py ner` (the peer's CoNLL NER fine-tuning) under the name RESULTS.md and docs/results/ner/
use: `python benchmarks/ner_peer.py --model DIR --output-dir runs/peer-ner --seed 42 --num-threads 1`."""

import sys

from peer import main

if __name__ == "__main__":
    sys.exit(main(["ner", *sys.argv[1:]]))
