"""Chat prompts: a folder's own chat template renders as transformers' ``apply_chat_template``, and
the server prompts and stops as ``LLM.chat`` does (one path, ``inferlab.model.chat``)."""
from __future__ import annotations

import json
import shutil

import pytest

from inferlab import LLM, SamplingParams
from inferlab.model.chat import ChatTemplate
from inferlab.model.loader import resolve_model_path
from inferlab.serve.launcher import ServerThread, make_app
from tests.core.chat_folder import IM_END, make_chat_model

CHATML = ("{{ bos_token }}{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
          "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
STRICT = ("{% for m in messages %}{% if (m['role'] == 'user') != (loop.index0 % 2 == 0) %}"
          "{{ raise_exception('roles must alternate user/assistant') }}{% endif %}"
          "[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}[assistant] ")
MESSAGES = [{"role": "system", "content": "You write Python."},
            {"role": "user", "content": "def add(a, b):"},
            {"role": "assistant", "content": "    return a + b"},
            {"role": "user", "content": "now sub"}]


@pytest.fixture(scope="module")
def chat_folder(tmp_path_factory):
    """The embedded draft model with a ChatML template added to its tokenizer_config.json."""
    folder = tmp_path_factory.mktemp("chatml") / "draft"
    shutil.copytree(resolve_model_path("draft"), folder)
    cfg = json.loads((folder / "tokenizer_config.json").read_text())
    (folder / "tokenizer_config.json").write_text(json.dumps({**cfg, "chat_template": CHATML}))
    return folder


def test_folder_template_renders_as_transformers(chat_folder):
    transformers = pytest.importorskip("transformers")
    hf = transformers.AutoTokenizer.from_pretrained(chat_folder)
    want = hf.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True)
    template = ChatTemplate.from_folder(chat_folder)
    assert not template.is_default
    assert template.render(MESSAGES) == want


def test_default_template_joins_contents():
    assert ChatTemplate.from_folder(resolve_model_path("draft")) is None  # a code model has no chat format
    assert ChatTemplate().render(MESSAGES) == "You write Python.\ndef add(a, b):\n    return a + b\nnow sub"


def test_the_old_import_still_works():
    from inferlab.serve.chat import ChatTemplate as Moved
    assert Moved is ChatTemplate


def test_template_refusal_is_a_400(chat_folder):
    from openai import BadRequestError, OpenAI

    with ServerThread(make_app(str(chat_folder), served_model_name="tiny", device="cpu")) as server:
        server.app.state.serving.chat_template = ChatTemplate(STRICT)
        client = OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)
        ok = client.chat.completions.create(model="tiny", messages=MESSAGES[1:], max_tokens=3, temperature=0)
        assert ok.choices[0].finish_reason in ("stop", "length")
        with pytest.raises(BadRequestError, match="roles must alternate"):
            client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=3)


def test_server_prompts_with_the_folder_template(chat_folder):
    transformers = pytest.importorskip("transformers")
    from openai import OpenAI

    hf = transformers.AutoTokenizer.from_pretrained(chat_folder)
    ids = hf.apply_chat_template(MESSAGES, tokenize=True, add_generation_prompt=True)
    ids = ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids
    with ServerThread(make_app(str(chat_folder), served_model_name="tiny", device="cpu")) as server:
        client = OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)
        r = client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=4, temperature=0)
        assert r.usage.prompt_tokens == len(ids)
        plain = client.completions.create(model="tiny", prompt=list(ids), max_tokens=4, temperature=0)
        assert r.choices[0].message.content == plain.choices[0].text


def test_server_and_llm_chat_prompt_and_stop_alike(tmp_path):
    """The same messages give the same prompt ids, the same reply and the same stop at the
    end-of-turn token, streamed or not."""
    from openai import OpenAI

    conversation = [{"role": "user", "content": "How do I reset my password?"}]
    folder = make_chat_model(tmp_path, conversation)
    want = LLM(str(folder), device="cpu").chat(conversation, SamplingParams(temperature=0, max_tokens=24))[0]
    assert want.outputs[0].token_ids[-1] == IM_END and want.outputs[0].finish_reason == "stop"
    with ServerThread(make_app(str(folder), served_model_name="tiny", device="cpu")) as server:
        ids, _ = server.app.state.serving._chat_prompt(conversation)
        assert ids == want.prompt_token_ids
        client = OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)
        r = client.chat.completions.create(model="tiny", messages=conversation, max_tokens=24, temperature=0)
        assert r.choices[0].message.content == want.outputs[0].text and r.choices[0].finish_reason == "stop"
        assert (r.usage.prompt_tokens, r.usage.completion_tokens) == (len(ids), len(want.outputs[0].token_ids))
        chunks = list(client.chat.completions.create(model="tiny", messages=conversation, max_tokens=24,
                                                     temperature=0, stream=True))
        assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == want.outputs[0].text
        assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
