"""`bertforge reproduce table5|table6|table7` at toy size: the table's shape, resumption, one-line errors.

Toy size: 6 plays besides the held-out ones, a 500-token vocabulary, 3 pre-training steps, one seed,
48 examples per task, one epoch; each table's command takes seconds to half a minute on one thread.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch

from bertforge.cli import main
from bertforge.modeling import BertConfig, BertForSequenceClassification
from bertforge.reproduce.heads import BertBiLSTMForTokenClassification, pool_bilstm, pool_last_token
from bertforge.reproduce import ReproduceSettings, variants
from bertforge.reproduce.report import task_label
from bertforge.reproduce.run import MANIFEST, _recorded

SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "data"
TOY = ["--plays", "6", "--steps", "3", "--seeds", "1", "--vocab-size", "500", "--dupe-factor", "1",
       "--max-train-examples", "48", "--max-dev-examples", "48", "--finetune-epochs", "1", "--feature-epochs", "1",
       "--lstm-hidden", "16", "--ner-train-sentences", "48", "--ner-dev-sentences", "48", "--num-threads", "1",
       "--no-progress"]
TABLES = {"table5": ["--config", "1/32/2", "--random-init-row"],
          "table6": ["--sizes", "1/32/2,2/32/2,2/64/4", "--glue", "mrpc", "--glue-dir", str(SHARED / "glue")],
          "table7": ["--config", "4/32/2", "--conll-dir", str(SHARED / "conll2003")]}
TASKS = {"table5": ["genre", "reply", "continuation", "names"],
         "table6": ["genre", "reply", "continuation", "names", "mrpc"],
         "table7": ["conll", "names"]}


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def markdown_rows(text: str) -> list[list[str]]:
    """The cells of table.md's first table: the header, then one list per row."""
    block = []
    for line in text.splitlines():
        if line.startswith("|"):
            block.append([c.strip() for c in line.strip("|").split("|")])
        elif block:
            break
    return [row for row in block if not all(re.fullmatch(r"-+", c) for c in row)]


def journal(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "journal.jsonl").read_text().splitlines()]


def run(table: str, out: Path, *extra: str) -> int:
    return main(["reproduce", table, "--output-dir", str(out), *TOY, *TABLES[table], *extra])


@pytest.mark.parametrize("table", ["table5", "table6", "table7"])
def test_table_shape_and_rerun_resumes(table, tmp_path, capsys):
    if table == "table7" and not (SHARED / "conll2003" / "train.txt").is_file():
        pytest.skip("CoNLL-2003 is not in ../shared/data")
    if table == "table6" and not (SHARED / "glue" / "MRPC" / "train.tsv").is_file():
        pytest.skip("GLUE's MRPC is not in ../shared/data")
    out = tmp_path / table
    assert run(table, out) == 0
    rows = markdown_rows((out / "table.md").read_text())
    expected = variants(ReproduceSettings(output_dir=out, table=table, sizes="1/32/2,2/32/2,2/64/4",
                                          random_init_row=table == "table5"))
    header, body = rows[0], rows[1:]
    assert len(body) == len(expected)
    for task in TASKS[table]:
        assert task_label(task) in header
    if table != "table6":
        assert [r[0] for r in body] == [v.name for v in expected]
        assert any(c.startswith("paper: ") for c in header)  # the paper's numbers beside
    for row in body:
        cells = [row[header.index(task_label(t))] for t in TASKS[table]]
        assert all(re.fullmatch(r"-?\d+\.\d ± \d+\.\d|—", c) for c in cells), row
    results = json.loads((out / "results.json").read_text())
    assert [v["key"] for v in results["variants"]] == [v.key for v in expected]
    assert (out / "plots" / "pretraining_loss.png").stat().st_size > 0
    assert (out / "plots" / "downstream.png").stat().st_size > 0
    ran = journal(out)
    pretrained = {v.pretrain for v in expected}
    assert sorted(r["variant"] for r in ran if r["stage"] == "pretrain") == sorted(pretrained)
    if table == "table5":
        # The same initial weights on the same first batch: BERT and No NSP start with the same masked-LM loss.
        first = {key: next(json.loads(line)["mlm_loss"] for line in (out / "pretrain" / key / "log.jsonl").open()
                           if "mlm_loss" in line) for key in ("bert", "no-nsp")}
        assert first["bert"] == pytest.approx(first["no-nsp"], abs=1e-5)
    markers = sorted(out.glob("finetune/*/*/seed*/DONE.json"))
    stamps = {m: m.stat().st_mtime_ns for m in markers}

    # The same command again: nothing is trained, the table is written again.
    assert run(table, out) == 0
    assert journal(out) == ran
    assert {m: m.stat().st_mtime_ns for m in markers} == stamps
    assert markdown_rows((out / "table.md").read_text()) == rows

    if table == "table5":
        # An interrupted pre-training run (no final model, RUNNING left) continues from its checkpoint;
        # the others and every fine-tuning run are read back.
        final = out / "pretrain" / "no-nsp" / "final"
        for path in final.iterdir():
            path.unlink()
        final.rmdir()
        (out / "pretrain" / "no-nsp" / "RUNNING").write_text("killed\n")
        assert run(table, out) == 0
        again = journal(out)[len(ran):]
        assert [(r["stage"], r["variant"]) for r in again] == [("pretrain", "no-nsp")]

    if table == "table7":
        # More seeds: only the new seed's fine-tuning runs are added.
        assert run(table, out, "--seeds", "2") == 0
        added = journal(out)[len(ran):]
        assert {r["seed"] for r in added} == {2} and {r["stage"] for r in added} == {"finetune"}
        assert len(added) == len(markers)
        assert "over 2 fine-tuning seed(s)" in (out / "table.md").read_text()


@pytest.mark.parametrize("arguments,message", [
    (["table5", "--steps", "0"], "--steps must be at least 1"),
    (["table6", "--sizes", "2/130/4"], "must be a multiple of #A"),
    (["table7", "--config", "tiny"], "needs 4 layers|has 2"),
    (["table7", "--conll-dir", "/nonexistent"], "table7 needs CoNLL-2003"),
    (["table5", "--config", "nothing.json"], "--config nothing.json: not a preset"),
    (["table5", "--corpus", "shakespeare+books", "--books-dir", "/nonexistent"], "no \\*.txt book"),
    (["table5", "--glue", "sst2,nope"], "unknown GLUE task 'nope'"),
    (["table7", "--glue", "sst2"], "table7 is about token tasks"),
    (["table5", "--glue", "mrpc", "--glue-dir", "/nonexistent"], "--glue mrpc: .*train.tsv not found"),
])
def test_bad_input_is_one_line_before_work(arguments, message, tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["reproduce", *arguments, "--output-dir", str(out)]) == 2
    error = capsys.readouterr().err.strip()
    assert len(error.splitlines()) == 1 and re.search(message, error), error
    assert not out.exists()  # nothing written before the check


def test_unknown_table_and_foreign_directory(tmp_path, capsys):
    with pytest.raises(SystemExit):
        main(["reproduce", "table8", "--output-dir", str(tmp_path / "x")])
    assert "invalid choice: 'table8'" in capsys.readouterr().err
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine\n")
    assert main(["reproduce", "table5", "--output-dir", str(foreign)]) == 2
    assert "not a `bertforge reproduce` run" in capsys.readouterr().err
    (tmp_path / "file").write_text("")
    assert main(["reproduce", "table5", "--output-dir", str(tmp_path / "file")]) == 2
    assert "--output-dir" in (err := capsys.readouterr().err) and "exists and is not a directory" in err


def test_other_settings_in_the_same_directory_are_refused(tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    settings = ReproduceSettings(output_dir=out, table="table5")
    (out / MANIFEST).write_text(json.dumps(_recorded(settings)))
    assert main(["reproduce", "table5", "--output-dir", str(out), "--steps", "5"]) == 2
    assert "--steps 2000 (now 5)" in capsys.readouterr().err


def test_table7_fine_tunes_at_its_own_rate_and_trains_features_at_theirs(tmp_path):
    """Table 7's Fine-tuning row defaults to a lower rate than Tables 5 and 6 (its 6-layer model did not
    fine-tune reliably at 1e-3); the feature-based BiLSTM keeps --feature-lr; a given --finetune-lr wins."""
    from bertforge.reproduce.finetune import finetune_arguments
    table7 = ReproduceSettings(output_dir=tmp_path, table="table7")
    rows = {v.key: v for v in variants(table7)}
    assert finetune_arguments(rows["finetune"], table7, tmp_path, 1).lr == 5e-4
    assert finetune_arguments(rows["features-concat-last-4"], table7, tmp_path, 1).lr == 1e-3
    assert ReproduceSettings(output_dir=tmp_path, table="table5").finetune_lr == 1e-3
    assert ReproduceSettings(output_dir=tmp_path, table="table7", finetune_lr=2e-4).finetune_lr == 2e-4


def test_ltr_classifies_from_the_last_real_token():
    torch.manual_seed(0)
    config = BertConfig.preset("tiny", vocab_size=50, is_causal=True, num_labels=2, hidden_dropout_prob=0.0,
                               attention_probs_dropout_prob=0.0)
    model = pool_last_token(BertForSequenceClassification(config)).eval()
    ids = torch.tensor([[2, 7, 8, 9, 3], [2, 7, 3, 0, 0]])
    mask = (ids != 0).long()
    with torch.no_grad():
        logits = model(ids, attention_mask=mask).logits
        alone = model(ids[1:, :3], attention_mask=mask[1:, :3]).logits  # the padded row without its padding
        changed = model(torch.tensor([[2, 5, 8, 9, 3]]), attention_mask=mask[:1]).logits
        hidden = model.bert(ids, attention_mask=mask).last_hidden_state
    assert torch.allclose(logits[1], alone[0], atol=1e-5)
    assert not torch.allclose(logits[0], changed[0])  # an earlier token changes the sentence vector
    expected = torch.tanh(model.bert.pooler.dense(hidden[torch.arange(2), torch.tensor([4, 2])]))
    model.bert.pooler.mask = mask
    assert torch.allclose(model.bert.pooler(hidden), expected, atol=1e-6)


def test_bilstm_head_reads_only_real_tokens(tmp_path):
    torch.manual_seed(0)
    config = BertConfig.from_dict({**BertConfig.preset("tiny", vocab_size=50, num_labels=3, hidden_dropout_prob=0.0,
                                                       attention_probs_dropout_prob=0.0).to_dict(), "bilstm_hidden": 8})
    model = BertBiLSTMForTokenClassification(config).eval()
    ids = torch.tensor([[2, 7, 8, 3, 0, 0]])
    with torch.no_grad():
        padded = model(ids, attention_mask=(ids != 0).long()).logits
        alone = model(ids[:, :4], attention_mask=torch.ones(1, 4, dtype=torch.long)).logits
    assert padded.shape == (1, 6, 3) and torch.allclose(padded[:, :4], alone, atol=1e-5)
    model.save_pretrained(tmp_path)
    again = BertBiLSTMForTokenClassification.from_pretrained(tmp_path)
    assert not again.load_report.newly_initialized


def test_bilstm_sentence_vector_reads_only_real_tokens():
    torch.manual_seed(0)
    config = BertConfig.preset("tiny", vocab_size=50, is_causal=True, num_labels=2, hidden_dropout_prob=0.0,
                               attention_probs_dropout_prob=0.0)
    model = pool_bilstm(BertForSequenceClassification(config), 8).eval()
    ids = torch.tensor([[2, 7, 8, 9, 3], [2, 7, 3, 0, 0]])
    with torch.no_grad():
        logits = model(ids, attention_mask=(ids != 0).long()).logits
        alone = model(ids[1:, :3], attention_mask=torch.ones(1, 3, dtype=torch.long)).logits
    assert torch.allclose(logits[1], alone[0], atol=1e-5)
    assert model.bert.pooler.lstm.hidden_size == 8


def test_books_join_the_corpus_one_sentence_per_line(tmp_path):
    from bertforge.corpus import shakespeare_plays
    from bertforge.reproduce.pretrain import write_corpus

    book = tmp_path / "Someone_Book_1900.txt"
    book.write_text("CHAPTER I\n\nIt was a dark night. The wind\nblew hard.\n\nShe said, \"Come in.\" He did.\n")
    plays = shakespeare_plays()[:1]
    train, held_out = write_corpus(plays, tmp_path / "corpus", [book])
    assert held_out == [] and len(train) == 2
    assert train[1].read_text().splitlines() == ["CHAPTER I", "It was a dark night.", "The wind blew hard.",
                                                 "She said, \"Come in.\"", "He did."]
    assert train[0].read_text().splitlines() == plays[0].speeches


def test_tasks_are_deterministic_and_dev_comes_from_held_out_plays(tmp_path):
    from bertforge.corpus import shakespeare_plays
    from bertforge.quickstart import HELD_OUT
    from bertforge.reproduce.downstream import build_tasks, character_names
    from bertforge.reproduce.pretrain import choose_plays

    plays = choose_plays(shakespeare_plays(), 6)
    macbeth = next(p for p in plays if p.title == "Macbeth")
    assert len(macbeth.speakers) == len(macbeth.speeches) and macbeth.speakers[0] == "First Witch"
    names = character_names(macbeth)
    assert {"Macbeth", "Banquo", "Duncan"} <= names and not names & {"Lady", "Witch", "First", "Lord"}
    first = build_tasks(plays, tmp_path / "a", 40, 40, seed=0)
    build_tasks(plays, tmp_path / "b", 40, 40, seed=0)
    for path in sorted((tmp_path / "a").rglob("*.*")):
        assert path.read_bytes() == (tmp_path / "b" / path.relative_to(tmp_path / "a")).read_bytes(), path
    dev_plays = {row.split(",")[1] for row in first.path("continuation", "dev").read_text().splitlines()[1:]}
    assert dev_plays <= set(HELD_OUT)
    assert all(count["dev"] > 0 and count["train"] > 0 for count in first.counts.values())
    # The continuation cap changes that task's training file only.
    capped = build_tasks(plays, tmp_path / "c", 40, 40, seed=0, max_choice=10)
    assert capped.counts["continuation"]["train"] == 10 < first.counts["continuation"]["train"]
    for path in sorted((tmp_path / "a").rglob("*.*")):
        if path != first.path("continuation", "train") and path.name != "info.json":
            assert path.read_bytes() == (tmp_path / "c" / path.relative_to(tmp_path / "a")).read_bytes(), path
