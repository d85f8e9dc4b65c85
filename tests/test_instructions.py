"""Prose instructions (core.prompt.read_instruct): the vocabulary's words in a direction are
applied, the rest ignored and reported; strict_instructions refuses, naming the input once and
listing the vocabulary in the request's language. Fast: the runtime config alone, no model run."""

from __future__ import annotations

import pytest

from omnivoice_onnx.core.instruct import read_instruct, resolve_instruct
from omnivoice_onnx.errors import UserError

OPENAI_EXAMPLE = "Speak in a cheerful and positive tone."


def test_a_vocabulary_instruct_is_read_as_upstream_reads_it(config) -> None:
    data = config["instruct"]
    reading = read_instruct("Female, Low Pitch", False, data)
    assert reading.instruct == resolve_instruct("Female, Low Pitch", False, data) == "female, low pitch"
    assert reading.applied == ("female", "low pitch") and reading.ignored == ()
    assert read_instruct("female, 河南话", True, data).instruct == resolve_instruct("female, 河南话", True, data)
    with pytest.raises(UserError, match="Conflicting"):  # an explicit contradiction stays an error
        read_instruct("male, female", False, data)


def test_prose_applies_the_words_it_knows_and_reports_the_rest(config) -> None:
    data = config["instruct"]
    nothing = read_instruct(OPENAI_EXAMPLE, False, data)
    assert (nothing.instruct, nothing.applied) == (None, ())
    assert nothing.ignored == ("Speak in a cheerful and positive tone",)

    reading = read_instruct("A deep, old woman's voice with a British accent; whispering please", False, data)
    assert reading.applied == ("low pitch", "elderly", "female", "british accent", "whisper")
    assert reading.instruct == "low pitch, elderly, female, british accent, whisper"
    assert reading.ignored == ("A", "'s voice with a", "please")

    clash = read_instruct("a man, no, a woman with a Henan accent 河南话 and an indian accent", False, data)
    assert clash.applied == ("男", "河南话")  # a dialect makes the items Chinese, as upstream does
    assert "woman (conflicts with male)" in clash.ignored and "indian accent (conflicts with 河南话)" in clash.ignored

    typo = read_instruct("mal, low pitch", False, data)
    assert typo.applied == ("low pitch",) and typo.ignored == ("mal (did you mean 'male'?)",)
    assert read_instruct("female voice", False, data).applied == ("female",)  # "male" is not inside "female"


def test_strict_refuses_naming_the_input_once_in_the_request_language(config) -> None:
    data = config["instruct"]
    with pytest.raises(UserError) as info:
        read_instruct(OPENAI_EXAMPLE, False, data, strict=True)
    message = str(info.value)
    assert message.count(OPENAI_EXAMPLE) == 1 and "\n" not in message
    assert all(item in info.value.fix for item in data["valid_en"])
    assert not any(item in info.value.fix for item in data["valid_zh"])
    with pytest.raises(UserError) as info:
        read_instruct("mal, low pitch", False, data, strict=True)
    assert "did you mean 'male' for 'mal'?" in str(info.value)
    with pytest.raises(UserError) as info:
        read_instruct("开心地说", True, data, strict=True)
    assert all(item in info.value.fix for item in data["valid_zh"]) and "american accent" not in info.value.fix
