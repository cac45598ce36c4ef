"""Chat templates moved to :mod:`inferlab.model.chat` (chat belongs to the model, not to the server)."""
from inferlab.model.chat import DEFAULT_TEMPLATE, Chat, ChatTemplate, ChatTemplateError

__all__ = ["DEFAULT_TEMPLATE", "Chat", "ChatTemplate", "ChatTemplateError"]
