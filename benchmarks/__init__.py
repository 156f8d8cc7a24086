"""bertforge's benchmarks: speed and memory beside the peer, and the harness that times them.

Run from the repository root:

    python -m benchmarks list                          # every ported benchmark and the figure it backs
    python -m benchmarks run NAME... [--quick]         # time them; JSON to docs/results/ (--quick: stdout)
    python -m benchmarks render [--check]              # the docs' tables from their result JSON

`harness.py` times, `render.py` writes the docs' tables, and each benchmark is a module declaring
`BENCHMARKS` (see `harness.Benchmark`). A report (`report.py`) is a table rendered from result files already
written, with nothing to run: `results.py` declares RESULTS.md's. `headlines.py` declares the headline tables
(RESULTS.md's, BENCHMARKS.md's and README.md's), each row read from its section's files. The other files here
are the scripts not yet ported: they are still run as files (`python benchmarks/pretrain.py`), which this
package does not change.
`peer.py` is the one transformers `Trainer` side of every fine-tuning comparison (`python benchmarks/peer.py
FAMILY`: glue, multi-label, ner, squad); glue_peer.py, multi_label_peer.py, ner_peer.py and squad_peer.py run it
under the names the results cite.
"""
