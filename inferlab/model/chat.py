"""Chat: the prompt a chat model was trained on, and the token that ends its reply.

A chat model is trained on conversations laid out in one exact format, a Jinja template that
travels with its tokenizer (``tokenizer.chat_template``): an HF folder keeps it in
``chat_template.jinja`` (what transformers 5 writes), in ``tokenizer_config.json``'s
``chat_template`` or in ``chat_template.json``; a GGUF file in ``tokenizer.chat_template``. We
render it the way transformers' ``apply_chat_template`` does (a sandboxed Jinja environment with
``trim_blocks``, ``lstrip_blocks`` and the same helpers), so a Qwen or Llama sees the prompt it was
trained on. ChatML (Qwen, SmolLM), for one user message:

    <|im_start|>user\\nHow do I reset my password?<|im_end|>\\n<|im_start|>assistant\\n

The template writes the special tokens itself, so the prompt is encoded without adding them
again. The model ends its reply by emitting the token the template writes after each message
(``<|im_end|>``; Llama 3's ``<|eot_id|>``, Gemma's ``<end_of_turn>``). It is often the model's
eos, but not always (Llama 3's eos is ``<|end_of_text|>``), and a model that is not stopped there
goes on to write the user's next turn itself: :class:`Chat` adds it to the request's stop ids.
``LLM.chat``, ``inferlab generate --chat`` and the server's ``/v1/chat/completions`` all go
through :class:`Chat`, so the three prompt and stop alike.

The embedded models are code-completion models with no chat format: they were trained on plain
Python source. For them (and any tokenizer without a template) the default template writes the
messages' contents one after another, each on its own line, with the roles left out: a user
message ``def fib(n):`` is continued as code, which is all such a model can do.
"""
from __future__ import annotations

import dataclasses
import json
from datetime import datetime
from pathlib import Path

from inferlab.errors import InferlabError

DEFAULT_TEMPLATE = "{% for m in messages %}{% if not loop.first %}{{ '\\n' }}{% endif %}{{ m['content'] }}{% endfor %}"
SPECIAL_TOKENS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")
_PROBE = "inferlab-probe-reply"  # the content of the reply end_of_turn renders


class ChatTemplateError(InferlabError):
    """A template that is not valid Jinja, or that refuses a conversation: one line."""


class ChatTemplate:
    """A chat template's Jinja source and the special tokens it may name (``{{ bos_token }}``...).
    ``ChatTemplate()`` is the plain default, for models that have none."""

    def __init__(self, template: str | None = None, special_tokens: dict | None = None):
        self.source = template or DEFAULT_TEMPLATE
        self.is_default = not template
        # as transformers: only the tokens the tokenizer has (a None would render as "None")
        self.special_tokens = {k: v for k, v in (special_tokens or {}).items() if v is not None}
        self._compiled = None
        self._end_of_turn = None  # (tokenizer, id): found once per tokenizer

    @classmethod
    def from_folder(cls, folder: str | Path) -> "ChatTemplate | None":
        """An HF folder's template, looked for where transformers looks (``chat_template.jinja``,
        then ``tokenizer_config.json``, then ``chat_template.json``), with the special tokens of
        ``tokenizer_config.json`` (or ``special_tokens_map.json``); None when it has none."""
        folder = Path(folder)
        cfg = _read_json(folder / "tokenizer_config.json")
        tokens_map = _read_json(folder / "special_tokens_map.json")
        special = {k: _token_text(cfg.get(k, tokens_map.get(k))) for k in SPECIAL_TOKENS}
        jinja = folder / "chat_template.jinja"
        if jinja.is_file():
            template = jinja.read_text(encoding="utf-8")
        else:
            template = cfg.get("chat_template") or _read_json(folder / "chat_template.json").get("chat_template")
        if isinstance(template, list):  # several named templates: take "default"
            template = {t["name"]: t["template"] for t in template}.get("default")
        return cls(template, special) if template else None

    def render(self, messages: list[dict], add_generation_prompt: bool = True, **variables) -> str:
        """The prompt for ``messages`` ([{"role", "content"}]); with ``add_generation_prompt`` it
        ends where the reply begins. ``variables``: more template inputs (``enable_thinking``...)."""
        from jinja2 import TemplateSyntaxError

        try:
            if self._compiled is None:
                self._compiled = _environment().from_string(self.source)
            return self._compiled.render({**self.special_tokens, **variables, "messages": messages,
                                          "add_generation_prompt": add_generation_prompt})
        except TemplateSyntaxError as exc:
            raise ChatTemplateError(f"the chat template is not valid Jinja (line {exc.lineno}): "
                                    f"{_one_line(exc.message)}") from None
        except Exception as exc:  # raise_exception(...) in the template, a missing field, a type error
            raise ChatTemplateError(f"the chat template could not render these messages: {_one_line(exc)}") from None

    def end_of_turn(self, tokenizer) -> int | None:
        """The id of the token that ends a reply: the first added (special) token the template
        writes after an assistant message's content, whitespace aside. Found by rendering a probe
        reply (after a user message, or alone for templates that refuse that); None when the
        template writes plain text there, or is the default."""
        if self.is_default or tokenizer is None:
            return None
        if self._end_of_turn is None or self._end_of_turn[0] is not tokenizer:
            self._end_of_turn = (tokenizer, self._find_end_of_turn(tokenizer))
        return self._end_of_turn[1]

    def _find_end_of_turn(self, tokenizer) -> int | None:
        reply = {"role": "assistant", "content": _PROBE}
        for messages in ([{"role": "user", "content": "Hi."}, reply], [reply]):
            try:
                text = self.render(messages, add_generation_prompt=False)
            except ChatTemplateError:
                continue
            if _PROBE in text:
                added = tokenizer.hf.get_added_tokens_decoder()
                for tok in tokenizer.encode(text[text.rindex(_PROBE) + len(_PROBE):], add_special_tokens=False):
                    if tok in added:
                        return tok
                    if tokenizer.decode([tok], skip_special_tokens=False).strip():
                        return None  # text comes first: the turn ends in plain text
                return None
        return None


def special_tokens_of(tokenizer) -> dict:
    """``bos_token`` and ``eos_token`` as the tokenizer's ids spell them: the special tokens of a
    template that comes without a tokenizer_config.json (a GGUF's, an override)."""
    out = {}
    if tokenizer.bos_token_id is not None:
        out["bos_token"] = tokenizer.hf.id_to_token(tokenizer.bos_token_id)
    if tokenizer.eos_token_ids:
        out["eos_token"] = tokenizer.hf.id_to_token(tokenizer.eos_token_ids[0])
    return out


class Chat:
    """One model's way of chatting: its tokenizer, its template (``template``: an override, a
    ``ChatTemplate`` or Jinja source) and the token that ends its turn (``end_of_turn_id``)."""

    def __init__(self, tokenizer, template: ChatTemplate | str | None = None):
        if tokenizer is None:
            raise InferlabError("this model has no tokenizer.json: chat needs one to encode the conversation")
        own = getattr(tokenizer, "chat_template", None)
        if isinstance(template, str):  # Jinja source: the model's special tokens go with it
            template = ChatTemplate(template, own.special_tokens if own else special_tokens_of(tokenizer))
        self.tokenizer = tokenizer
        self.template = template or own or ChatTemplate()
        self.end_of_turn_id = self.template.end_of_turn(tokenizer)

    def prompt(self, messages: list[dict], add_generation_prompt: bool = True, **variables) -> tuple[str, list[int]]:
        """The rendered prompt and its token ids. A real template wrote the special tokens (bos
        included) itself, so only the default one has the tokenizer add them."""
        text = self.template.render(messages, add_generation_prompt, **variables)
        return text, self.tokenizer.encode(text, add_special_tokens=self.template.is_default)

    def sampling_params(self, params):
        """``params`` that also stop at the end-of-turn token, unless they ``ignore_eos`` (it is the
        chat's eos). Its text joins the stop strings when decoding would show it (an added token
        not marked special), so the reply never carries it."""
        eot = self.end_of_turn_id
        if eot is None or params.ignore_eos or eot in params.stop_token_ids:
            return params
        text = self.tokenizer.decode([eot])
        stop = params.stop + [text] if text and text not in params.stop else params.stop
        return dataclasses.replace(params, stop_token_ids=[*params.stop_token_ids, eot], stop=stop)


def _read_json(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}


def _token_text(tok):
    return tok.get("content") if isinstance(tok, dict) else tok


def _one_line(exc) -> str:
    return " ".join(str(exc).split())


def _environment():
    """transformers' chat-template environment: sandboxed, immutable, with its helpers."""
    import jinja2.ext
    from jinja2.exceptions import TemplateError
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message):
        raise TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson  # Jinja's own escapes HTML characters
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env
