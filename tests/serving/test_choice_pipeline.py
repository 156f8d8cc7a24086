"""The multiple-choice pipeline: the same probabilities as the fine-tuning code path, input checks,
the checkpoint -> task resolution, the predict helper and the server route."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
import torch

from bertforge.modeling import BertForMultipleChoice
from bertforge.serving import PipelineInputError, pipeline
from bertforge.serving.pipelines import MultipleChoicePipeline, predict_multiple_choice
from bertforge.tasks.multiple_choice import ChoiceExample, collate, convert_examples_to_features

CONTEXTS = ["John Smith moved to Paris.", "The movie was great."]
ENDINGS = [["He lives in France.", "He was born in Berlin.", "It is a river.", "Mary loved it."],
           ["It was fun.", "It was boring."]]


@pytest.fixture(scope="module")
def choice_dir(tiny_dirs, tmp_path_factory):
    """The tiny multiple-choice checkpoint with a sharper head: a random head's probabilities are all
    about 1/K, which would let a pipeline that mixes up its rows pass."""
    directory = tmp_path_factory.mktemp("sharp") / "choice"
    shutil.copytree(tiny_dirs["multiple-choice"], directory)
    model = BertForMultipleChoice.from_pretrained(directory)
    with torch.no_grad():
        model.classifier.weight.mul_(2e4)
    model.save_pretrained(directory)
    return directory


@pytest.fixture(scope="module")
def choose(choice_dir):
    return pipeline("multiple-choice", model=choice_dir)


def test_one_result_per_context_with_probabilities_over_its_endings(choose):
    results = choose(CONTEXTS, ENDINGS)
    assert len(results) == 2
    for result, endings in zip(results, ENDINGS):
        assert len(result["scores"]) == len(endings)  # inputs may have different numbers of endings
        assert sum(result["scores"]) == pytest.approx(1.0, abs=1e-6)
        assert all(0.0 <= p <= 1.0 for p in result["scores"])
        assert result["label"] == int(np.argmax(result["scores"]))
        assert result["ending"] == endings[result["label"]]
        assert result["score"] == pytest.approx(max(result["scores"]))


def test_probabilities_match_the_fine_tuning_code_path(choice_dir, choose):
    """The pipeline's flattened rows give what BertForMultipleChoice gives on (B, K, S) batches built by
    bertforge.tasks.multiple_choice (the code that trains and evaluates the model)."""
    model = BertForMultipleChoice.from_pretrained(choice_dir).eval()
    examples = [ChoiceExample("0", CONTEXTS[0], "", ENDINGS[0])]
    features = convert_examples_to_features(examples, choose.tokenizer, choose.max_length)
    batch = collate(features, choose.tokenizer.pad_token_id)
    with torch.no_grad():
        expected = torch.softmax(model(**batch).logits.float(), -1)[0].numpy()
    actual = np.array(choose(CONTEXTS[:1], ENDINGS[:1])[0]["scores"])
    np.testing.assert_allclose(actual, expected, atol=1e-5)
    assert actual.max() - actual.min() > 0.05  # not uniform: the check above compares something
    # The optional SWAG start segment changes the inputs, so the scores.
    started = choose(CONTEXTS[:1], ENDINGS[:1], starts=["Then"])[0]["scores"]
    assert not np.allclose(started, actual)


def test_batching_does_not_change_results(choose):
    one_by_one = [choose([c], [e], batch_size=1)[0] for c, e in zip(CONTEXTS, ENDINGS)]
    together = choose(CONTEXTS, ENDINGS, batch_size=3)
    for a, b in zip(one_by_one, together):
        assert a["label"] == b["label"]
        # The sharpened head multiplies float rounding of other batch shapes too: 1e-4, not 1e-6.
        np.testing.assert_allclose(a["scores"], b["scores"], atol=1e-4)


@pytest.mark.parametrize("contexts, endings, reason", [
    (CONTEXTS, ENDINGS[:1], "2 contexts but 1 lists of endings"),
    (CONTEXTS[:1], [["only one"]], "at least 2"),
    (CONTEXTS[:1], [["fine", ""]], r"endings\[0\]\[1\] is empty"),
    (CONTEXTS[:1], ["not a list of endings"], "endings"),
])
def test_bad_inputs_are_the_callers_error(choose, contexts, endings, reason):
    with pytest.raises(PipelineInputError, match=reason):
        choose(contexts, endings)


def test_the_checkpoint_names_its_task_and_the_helper_predicts(choice_dir, choose):
    assert isinstance(pipeline(model=choice_dir), MultipleChoicePipeline)
    assert isinstance(pipeline("swag", model=choice_dir), MultipleChoicePipeline)
    helped = predict_multiple_choice(choice_dir, CONTEXTS, ENDINGS)
    for a, b in zip(helped, choose(CONTEXTS, ENDINGS)):
        assert a["label"] == b["label"]
        np.testing.assert_allclose(a["scores"], b["scores"], atol=1e-6)


def test_a_checkpoint_without_a_trained_choice_head_is_refused(tiny_dirs):
    with pytest.raises(ValueError):
        pipeline("multiple-choice", model=tiny_dirs["embed"])


def test_served_over_http(choose):
    pytest.importorskip("starlette", reason="the serve extra is not installed")
    pytest.importorskip("httpx", reason="httpx is needed for the server tests")
    from starlette.testclient import TestClient

    from bertforge.serving.server import create_app
    from bertforge.serving.server_settings import ServerSettings

    settings = ServerSettings(max_texts=4, max_chars=200, model="tiny")
    with TestClient(create_app({"multiple-choice": choose}, settings)) as client:
        response = client.post("/v1/multiple-choice", json={"contexts": CONTEXTS, "endings": ENDINGS})
        assert response.status_code == 200, response.text
        body = response.json()
        assert body["pipeline"] == "multiple-choice"
        results = body["results"]
        assert [r["label"] for r in results] == [r["label"] for r in choose(CONTEXTS, ENDINGS)]
        bad = client.post("/v1/multiple-choice", json={"contexts": CONTEXTS[:1], "endings": ["a", "b"]})
        assert bad.status_code == 422 and "endings[0]" in bad.text
        too_many = client.post("/v1/multiple-choice", json={"contexts": CONTEXTS[:1], "endings": [["a"] * 5]})
        assert too_many.status_code == 413
