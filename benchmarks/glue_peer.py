"""`python benchmarks/peer.py glue` (the peer's GLUE fine-tuning) under the name RESULTS.md, docs/results/glue_*/
and benchmarks/finetune.py use: `python benchmarks/glue_peer.py --task mrpc --model DIR --data-dir DIR`."""

import sys

from peer import main

if __name__ == "__main__":
    sys.exit(main(["glue", *sys.argv[1:]]))
