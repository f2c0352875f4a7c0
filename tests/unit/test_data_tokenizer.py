"""The tokenizer interface (unit): SentencePiece ids unchanged from before the interface,
special ids resolved by one rule, picklable for worker processes, bad files one line."""

from __future__ import annotations

import json
import pickle

import pytest

from depthbench.data import spm_tokenizer
from depthbench.data.tokenizer import open_tokenizer
from depthbench.digest import file_sha256
from depthbench.errors import ConfigError

ENGLISH = ("The river runs north of the old city. Small boats carry stone and iron to the "
           "great market, where people from the whole world trade gold and silver.\n")
TEXTS = [ENGLISH * 3 + f"Number {i}.\nThe king's {i % 7} ships." for i in range(200)]
PROBE = "The old king\nsails north, 42 boats of gold.\n\nA market!"

# Recorded at eba6c85, before the interface existed (spm_tokenizer.Tokenizer):
# the trained model's bytes and PROBE's ids.
MODEL_SHA256 = "db4f3bc02b9f5e34ab8c2121e0ef9e9152df321cfc5264dc841f057e7df32b68"
PROBE_IDS = [262, 283, 260, 262, 265, 268, 271, 262, 285, 273, 270, 277, 14, 262, 272, 267, 273,
             268, 272, 262, 270, 265, 264, 266, 269, 287, 262, 294, 292, 262, 284, 265, 267, 266,
             272, 262, 265, 280, 262, 277, 265, 268, 271, 276, 14, 14, 262, 69, 262, 274, 267,
             264, 285, 263, 266, 37]


@pytest.fixture(scope="module")
def spm_model(tmp_path_factory):
    path = tmp_path_factory.mktemp("spm") / "t.model"
    return spm_tokenizer.train(TEXTS, 300, path, num_threads=1)


def test_sentencepiece_ids_are_those_of_before(spm_model):
    assert file_sha256(spm_model) == MODEL_SHA256
    tk = open_tokenizer(spm_model, field="config.data.tokenizer")
    assert tk.kind == "sentencepiece"
    assert tk.encode(PROBE) == PROBE_IDS
    assert tk.encode_batch([PROBE, "x"], num_threads=1)[0] == PROBE_IDS
    assert tk.decode(PROBE_IDS) == PROBE == tk.decode(PROBE_IDS, skip_special_tokens=True)
    assert (tk.bos_id, tk.eos_id, tk.pad_id) == (1, 2, 3) and tk.token_text(2) == "</s>"
    assert tk.decode([tk.eos_id, *PROBE_IDS, tk.eos_id]) == PROBE  # control pieces: nothing
    assert not tk.adds_specials_by_default


def _word_tokenizer(path, vocab: dict[str, int], config: dict | None = None):
    from tokenizers import Tokenizer, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    path.parent.mkdir(parents=True, exist_ok=True)
    tok.save(str(path))
    if config is not None:
        path.with_name("tokenizer_config.json").write_text(json.dumps(config))
    return path


VOCAB = {"[UNK]": 0, "</s>": 1, "<|endoftext|>": 2, "<s>": 3, "hello": 4, "<pad>": 5}


def test_special_ids_resolve_by_one_rule(tmp_path):
    bare = _word_tokenizer(tmp_path / "bare" / "tokenizer.json", VOCAB)
    # No names anywhere: the first candidate the vocabulary holds; pad falls back to EOS.
    tk = open_tokenizer(bare, field="f")
    assert (tk.eos_id, tk.bos_id, tk.pad_id) == (2, -1, 2)
    assert open_tokenizer(bare, field="f", eos_id=1, bos_id=3).eos_id == 1  # a run's record
    assert open_tokenizer(bare, field="f", eos_token="</s>").eos_id == 1
    named = _word_tokenizer(tmp_path / "named" / "tokenizer.json", VOCAB,
                            {"eos_token": {"content": "</s>"}, "bos_token": "<s>",
                             "pad_token": "<pad>"})
    tk = open_tokenizer(named, field="f", eos_id=2)  # tokenizer_config.json wins over ids
    assert (tk.eos_id, tk.bos_id, tk.pad_id) == (1, 3, 5)
    assert open_tokenizer(named, field="f", eos_token="<|endoftext|>").eos_id == 2
    assert tk.record()["eos_token"] == "</s>" and tk.record()["sha256"] == file_sha256(named)


def test_bad_tokenizer_files_are_one_line(tmp_path, spm_model):
    cases = [
        (lambda: open_tokenizer(tmp_path, field="--tokenizer"),
         f"--tokenizer: '{tmp_path}' is a directory, not a tokenizer file"),
        (lambda: open_tokenizer(tmp_path / "none.json", field="--tokenizer"),
         f"--tokenizer: file '{tmp_path / 'none.json'}' does not exist"),
        (lambda: open_tokenizer(spm_model, field="--tokenizer", eos_token="</s>"),
         "--eos-token: only for tokenizer.json files"),
        (lambda: open_tokenizer(_word_tokenizer(tmp_path / "x" / "tokenizer.json",
                                                {"[UNK]": 0, "a": 1}), field="--tokenizer"),
         "has no EOS token (none named in tokenizer_config.json, none of <|endoftext|>"),
        (lambda: open_tokenizer(_word_tokenizer(tmp_path / "y" / "tokenizer.json", VOCAB),
                                field="--tokenizer", eos_token="<eos>"),
         "--eos-token: '<eos>' is not in "),
    ]
    for call, message in cases:
        with pytest.raises(ConfigError) as e:
            call()
        assert message in str(e.value) and "\n" not in str(e.value)


def test_tokenizers_pickle_as_their_file_and_options(tmp_path, spm_model):
    named = _word_tokenizer(tmp_path / "tokenizer.json", VOCAB)
    for tk in (open_tokenizer(spm_model, field="f"),
               open_tokenizer(named, field="f", eos_token="</s>")):
        copy = pickle.loads(pickle.dumps(tk))
        assert type(copy) is type(tk) and copy.eos_id == tk.eos_id
        assert copy.encode("hello hello") == tk.encode("hello hello")
