"""Turning chat messages into one prompt: the model's chat template, or a plain default.

A chat model is trained on conversations laid out in one exact format, and its folder says which
in ``tokenizer_config.json`` (``chat_template``, a Jinja template). We render it the way
transformers' ``apply_chat_template`` does (a sandboxed Jinja environment with ``trim_blocks`` and
``lstrip_blocks``, ``add_generation_prompt=True``), so a served Qwen or Llama sees the prompt it
was trained on.

The embedded models are code-completion models with no chat format: they were trained on plain
Python source. For them (and any folder without a template) the default template writes the
messages' contents one after another, each on its own line, with the roles left out: a user
message ``def fib(n):`` is continued as code, which is all such a model can do.
"""
from __future__ import annotations

import json
from pathlib import Path

DEFAULT_TEMPLATE = "{% for m in messages %}{% if not loop.first %}{{ '\\n' }}{% endif %}{{ m['content'] }}{% endfor %}"


class ChatTemplate:
    def __init__(self, template: str | None = None, special_tokens: dict | None = None):
        self.source = template or DEFAULT_TEMPLATE
        self.is_default = template is None
        self.special_tokens = special_tokens or {}
        self._compiled = None

    @classmethod
    def from_folder(cls, folder: str | Path | None) -> "ChatTemplate":
        """The template in ``folder/tokenizer_config.json``, or the default one."""
        path = Path(folder) / "tokenizer_config.json" if folder is not None else None
        if path is None or not path.is_file():
            return cls()
        cfg = json.loads(path.read_text())
        template = cfg.get("chat_template")
        if isinstance(template, list):  # several named templates: take "default"
            template = {t["name"]: t["template"] for t in template}.get("default")
        special = {k: _token_text(cfg.get(k)) for k in ("bos_token", "eos_token", "unk_token", "pad_token")}
        return cls(template, special)

    def render(self, messages: list[dict]) -> str:
        """The prompt for ``messages`` ([{"role", "content"}]), ending where the reply begins."""
        if self._compiled is None:
            self._compiled = _environment().from_string(self.source)
        return self._compiled.render(messages=messages, add_generation_prompt=True, **self.special_tokens)


def _token_text(tok):
    return tok.get("content") if isinstance(tok, dict) else tok


def _environment():
    from jinja2.exceptions import TemplateError
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message):
        raise TemplateError(message)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = raise_exception
    return env
