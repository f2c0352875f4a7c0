"""The lm-eval backend tests' shared fixture (a ``pytest_plugins`` module of
tests/conftest.py): a small random Hugging Face Llama saved with a tokenizer
and imported with import-hf, and lm-eval's ``hf`` backend and depthbench's
over it (tests/unit/test_eval_lm.py, tests/integration/test_eval_lm_tasks.py).
The optional libraries are imported inside the fixture, so this module loads
without the eval extras; the test files skip without them."""

from __future__ import annotations

import pytest
from eval_tiny import tiny_tokenizer

from depthbench.cli import main as cli_main

MAX_LEN = 48

# A local multiple-choice task for lm-eval (``name``; ``data``: a JSONL file of
# question, choices and label records).
MC_YAML = """\
task: {name}
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: multiple_choice
doc_to_text: "Question: {{{{question}}}}\\nAnswer:"
doc_to_target: "{{{{label}}}}"
doc_to_choice: "{{{{choices}}}}"
metric_list:
  - metric: acc
  - metric: acc_norm
"""


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """(HFLM, DepthbenchLM, HF model, root) on the same random Llama (GQA, untied)."""
    import torch
    import transformers
    from lm_eval.models.huggingface import HFLM

    from depthbench.evaluation.lm_backend import DepthbenchLM

    root = tmp_path_factory.mktemp("lm")
    hf_dir = root / "hf"
    tok_json = tiny_tokenizer(hf_dir)
    fast = transformers.PreTrainedTokenizerFast(tokenizer_file=str(tok_json), bos_token="<s>",
                                                eos_token="</s>", unk_token="<unk>")
    fast.save_pretrained(hf_dir)
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=320, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=MAX_LEN,
        initializer_range=0.2, bos_token_id=fast.bos_token_id, eos_token_id=fast.eos_token_id)
    model = transformers.LlamaForCausalLM(config).eval()
    model.save_pretrained(hf_dir)
    assert cli_main(["import-hf", str(hf_dir), "--out", str(root / "run")]) == 0
    hf = HFLM(pretrained=str(hf_dir), dtype="float32", device="cpu", batch_size=1)
    ours = DepthbenchLM(run=str(root / "run"), batch_size=4, progress=False)
    return hf, ours, model, root
