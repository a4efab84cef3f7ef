"""`--model-path` for a model loaded here: a folder or a cached Hugging Face id, else the user's one-line error."""

from __future__ import annotations

import pytest

from arenaforge.schemas.errors import InputError
from arenaforge.tracks.train.model_paths import local_model_path


def test_a_folder_is_taken_as_given(tmp_path):
    assert local_model_path(str(tmp_path)) == str(tmp_path)


@pytest.mark.parametrize("given", ["/no/such/checkpoint", "out/train/grpo/step-000012", "./step-1",
                                   "no-such-org/no-such-model", "not a repo id"])
def test_a_missing_model_is_one_line_naming_the_flag(tmp_path, monkeypatch, given):
    monkeypatch.chdir(tmp_path)  # relative paths name nothing here; the made-up id is in no cache
    with pytest.raises(InputError, match=r"^--model-path .*: no model folder there"):
        local_model_path(given)
