"""The one validator of the service (serve/validate.py): typed errors, each with its status per router."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from adalayers.errors import AdaLayersError
from adalayers.serve.errors import BadText, Empty, TooLarge, UnknownTask, openai_body, status_of
from adalayers.serve.validate import check_count, check_tasks, check_text, check_texts

SIDE = SimpleNamespace(heads={"cola": object(), "ner": object()}, names=["cola", "ner"])


def test_counts():
    with pytest.raises(Empty, match="^prompts is empty: give at least one prompt$") as e:
        check_count([], 3, "prompts", "prompt")
    assert (status_of(e.value, False), status_of(e.value, True)) == (422, 400)  # OpenAI says 400
    with pytest.raises(Empty, match="^input is empty: give at least one text$"):
        check_count([], 3, "inputs", "text", "input", field="input")
    with pytest.raises(TooLarge, match=r"^4 texts in one request; the limit is 3 \(--max-texts\)$") as e:
        check_count(["a"] * 4, 3, "texts", "text")
    assert status_of(e.value, True) == 413
    check_count(["a"] * 3, 3, "texts", "text")


def test_texts():
    with pytest.raises(TooLarge, match=r"^prompt 2 has 6 characters; the limit is 5 \(--max-chars\)$"):
        check_texts(["a", "abcdef"], 5, "prompt")
    with pytest.raises(BadText, match="^second text 1 is empty$") as e:
        check_texts([" "], 5, "second text")
    assert e.value.status == 422 and isinstance(e.value, AdaLayersError)
    with pytest.raises(BadText, match="not valid Unicode"):
        check_text("\ud800 a", 5, "text 1")
    check_text("", 5, "messages[0].content", blank_ok=True)  # a chat message may be empty
    check_text("  ", 5, "messages[0].content", blank_ok=True)
    with pytest.raises(BadText) as e:
        check_text("\ud800", 5, "messages[0].content", "messages[0].content", blank_ok=True)
    assert openai_body(e.value)["error"]["param"] == "messages[0].content"


def test_task_names():
    check_tasks(SIDE, ["cola", "ner"])
    check_tasks(SIDE, None)
    with pytest.raises(UnknownTask, match=r"^unknown task\(s\): nope; known tasks: cola, ner$") as e:
        check_tasks(SIDE, ["cola", "nope"], "adalayers")
    assert openai_body(e.value) == {"error": {"message": str(e.value), "type": "invalid_request_error",
                                              "param": "adalayers", "code": None}}
