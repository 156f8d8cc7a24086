"""`python benchmarks/peer.py squad` (the peer's SQuAD fine-tuning) under the name docs/results/squad/ and
benchmarks/squad_side_by_side.py use: `python benchmarks/squad_peer.py --model DIR --train-file T --dev-file D`."""

import sys

from peer import main

if __name__ == "__main__":
    sys.exit(main(["squad", *sys.argv[1:]]))
