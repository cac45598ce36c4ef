"""Chat as the model's: the template its tokenizer carries renders as transformers does, the reply
stops at the template's end-of-turn token, and ``LLM.chat`` and ``inferlab generate --chat`` agree."""
from __future__ import annotations

import json

import pytest
from tokenizers import AddedToken

from inferlab import LLM, SamplingParams
from inferlab.model.chat import Chat, ChatTemplate, ChatTemplateError
from inferlab.cli import main
from inferlab.model.loader import ASSETS
from inferlab.model.tokenizer import Tokenizer

from .chat_folder import CHATML, IM_END, make_chat_folder, make_chat_model

MESSAGES = [{"role": "system", "content": "You answer support questions."},
            {"role": "user", "content": "How do I reset my password?"}]
GREEDY = SamplingParams(temperature=0, max_tokens=24)
NO_SYSTEM = ("{% for m in messages %}{% if m['role'] == 'system' %}{{ raise_exception('this model takes no system "
             "message') }}{% endif %}{{ m['content'] }}{% endfor %}")


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return make_chat_model(tmp_path_factory.mktemp("chat"), MESSAGES)


@pytest.fixture(scope="module")
def llm(folder):
    return LLM(str(folder), device="cpu")


def hf_tokenizer(folder):
    transformers = pytest.importorskip("transformers")
    return transformers.AutoTokenizer.from_pretrained(folder)


# ---- the template: where a folder keeps it, rendered as transformers renders it -------------------

@pytest.mark.parametrize("where", ["chat_template.jinja", "tokenizer_config.json"])
def test_folder_template_renders_as_transformers(tmp_path, where):
    folder = make_chat_folder(tmp_path / "m", where=where)
    want = hf_tokenizer(folder).apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True)
    template = ChatTemplate.from_folder(folder)
    assert not template.is_default and template.render(MESSAGES) == want
    assert want.startswith("<|endoftext|><|im_start|>system\n")  # bos_token from tokenizer_config.json


def test_chat_template_json_and_the_order_transformers_reads_them_in(tmp_path):
    jinja = ChatTemplate.from_folder(make_chat_folder(tmp_path / "jinja")).render(MESSAGES)
    assert ChatTemplate.from_folder(make_chat_folder(tmp_path / "json", where="chat_template.json")).render(MESSAGES) == jinja
    both = make_chat_folder(tmp_path / "both")  # chat_template.jinja and another template in tokenizer_config.json
    cfg = json.loads((both / "tokenizer_config.json").read_text())
    (both / "tokenizer_config.json").write_text(json.dumps({**cfg, "chat_template": "{{ messages[0]['content'] }}"}))
    want = hf_tokenizer(both).apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True)
    assert ChatTemplate.from_folder(both).render(MESSAGES) == want == jinja


def test_the_tokenizer_carries_the_template(llm):
    assert llm.tokenizer.chat_template.source == CHATML
    assert LLM("target", device="cpu").tokenizer.chat_template is None  # a code model: the plain default


def test_llm_chat_prompts_with_transformers_ids(llm, folder):
    hf = hf_tokenizer(folder)
    ids = hf.apply_chat_template(MESSAGES, tokenize=True, add_generation_prompt=True)
    ids = list(ids["input_ids"] if hasattr(ids, "keys") else ids)
    out = llm.chat(MESSAGES, GREEDY)[0]
    assert out.prompt_token_ids == ids and ids[:2] == [0, 4096]  # one bos: the template's, not added again
    assert out.prompt == hf.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True)
    no_prompt = llm.chat(MESSAGES, GREEDY, add_generation_prompt=False)[0]
    assert no_prompt.prompt.endswith("How do I reset my password?<|im_end|>\n")


# ---- the end of the turn ----------------------------------------------------------------------

def test_chat_stops_at_the_end_of_turn_token_and_leaves_it_out_of_the_text(llm):
    full = llm.chat(MESSAGES, SamplingParams(temperature=0, max_tokens=24, ignore_eos=True))[0].outputs[0]
    assert IM_END in full.token_ids and full.finish_reason == "length"  # ignore_eos ignores the chat's eos too
    out = llm.chat(MESSAGES, GREEDY)[0].outputs[0]
    assert out.token_ids == full.token_ids[: full.token_ids.index(IM_END) + 1] and out.finish_reason == "stop"
    assert out.text and "<|im_end|>" not in out.text and out.text == llm.tokenizer.decode(out.token_ids)


LLAMA3 = ("{{ bos_token }}{% for m in messages %}{{ '<|start_header_id|>' + m['role'] + '<|end_header_id|>\n\n' "
          "+ m['content'] | trim + '<|eot_id|>' }}{% endfor %}"
          "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}")
GEMMA = ("{{ bos_token }}{% for m in messages %}{% if (m['role'] == 'user') != (loop.index0 % 2 == 0) %}"
         "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
         "{% set role = 'model' if m['role'] == 'assistant' else m['role'] %}"
         "<start_of_turn>{{ role }}\n{{ m['content'] | trim }}<end_of_turn>\n{% endfor %}"
         "{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}")
ZEPHYR = ("{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}{{ eos_token }}\n{% endfor %}"
          "{% if add_generation_prompt %}<|assistant|>\n{% endif %}")
PHI3 = "{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}<|end|>\n{% endfor %}<|assistant|>\n"
PLAIN = "{% for m in messages %}### {{ m['role'] }}:\n{{ m['content'] }}\n\n{% endfor %}### assistant:\n"
SPECIAL = ("<|im_start|>", "<|im_end|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>",
           "<start_of_turn>", "<end_of_turn>")


@pytest.fixture(scope="module")
def tokenizer():
    """The target's tokenizer with the special tokens of several chat formats added (and Phi-3's
    ``<|end|>`` as an added token not marked special, which decoding shows)."""
    tok = Tokenizer.from_file(ASSETS / "target" / "tokenizer.json", (0,), 0)
    tok.hf.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL])
    tok.hf.add_tokens([AddedToken("<|end|>", special=False, normalized=False)])
    return tok


@pytest.mark.parametrize("template,end", [(CHATML, "<|im_end|>"), (LLAMA3, "<|eot_id|>"), (GEMMA, "<end_of_turn>"),
                                          (ZEPHYR, "<|endoftext|>"), (PHI3, "<|end|>"), (PLAIN, None),
                                          (None, None)])
def test_the_end_of_turn_is_the_special_token_after_a_reply(tokenizer, template, end):
    chat = Chat(tokenizer, template)
    assert chat.end_of_turn_id == (None if end is None else tokenizer.hf.token_to_id(end))


def test_the_end_of_turn_joins_the_stop_ids_unless_eos_is_ignored(tokenizer):
    chatml, phi3 = Chat(tokenizer, CHATML), Chat(tokenizer, PHI3)
    im_end, end = tokenizer.hf.token_to_id("<|im_end|>"), tokenizer.hf.token_to_id("<|end|>")
    params = chatml.sampling_params(SamplingParams(stop_token_ids=[5], stop=["\n\n"]))
    assert params.stop_token_ids == [5, im_end] and params.stop == ["\n\n"]  # special: decoding drops it
    assert phi3.sampling_params(SamplingParams()).stop == ["<|end|>"]  # shown by decoding: cut as a stop string
    assert phi3.sampling_params(SamplingParams()).stop_token_ids == [end]
    kept = SamplingParams(ignore_eos=True)
    assert chatml.sampling_params(kept) is kept


# ---- several conversations, an override, a template that refuses ----------------------------------

def test_several_conversations_and_a_template_override(llm):
    other = [{"role": "user", "content": "And my username?"}]
    both = llm.chat([MESSAGES, other], GREEDY)
    alone = [llm.chat(m, GREEDY)[0] for m in (MESSAGES, other)]
    assert [o.outputs[0].token_ids for o in both] == [o.outputs[0].token_ids for o in alone]
    plain = llm.chat(other, GREEDY, chat_template="{% for m in messages %}{{ m['content'] }}{% endfor %}")[0]
    assert plain.prompt == "And my username?" and plain.prompt_token_ids == llm.tokenizer.encode(plain.prompt, False)


def test_a_template_that_raises_is_one_line(llm, tmp_path, capsys):
    with pytest.raises(ChatTemplateError, match="could not render these messages: this model takes no system") as err:
        llm.chat(MESSAGES, GREEDY, chat_template=NO_SYSTEM)
    assert "\n" not in str(err.value)
    with pytest.raises(ChatTemplateError, match=r"not valid Jinja \(line 1\)"):
        ChatTemplate("{% for m in messages %}{{ m }").render(MESSAGES)
    strict = make_chat_folder(tmp_path / "strict", template=NO_SYSTEM)
    code = main(["generate", "--chat", "Hi", "--system", "Be brief.", "--model", str(strict), "--device", "cpu"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "this model takes no system message" in err


# ---- inferlab generate --chat -----------------------------------------------------------------

def test_generate_chat_is_llm_chat(llm, folder, capsys):
    want = llm.chat(MESSAGES, GREEDY)[0].outputs[0]
    args = ["generate", "--chat", MESSAGES[1]["content"], "--system", MESSAGES[0]["content"], "--model", str(folder),
            "--device", "cpu", "--max-tokens", "24"]
    assert main(args + ["--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["token_ids"] == want.token_ids and data["finish_reason"] == "stop" and data["text"] == want.text
    assert main(args) == 0
    assert capsys.readouterr().out == want.text + "\n"  # the reply streamed, without the rendered prompt


def test_generate_system_needs_chat(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["generate", "Hi", "--system", "Be brief."])
    assert exit_.value.code == 2 and "--system goes with --chat" in capsys.readouterr().err
