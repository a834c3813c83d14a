"""A FastChat conversation template that renders prompts as the model's own chat template does.

FastChat's API server renders a chat itself, with the template its worker gives
(/worker_get_conv_template), and sends the worker plain text. So that a chat through
FastChat is the chat the model was trained on, and equal to one through /v1, the template
is read off the model's: rendered with marker messages, the strings around each message
give FastChat's NO_COLON_SINGLE style (system block, role prefixes, one separator), which
fits ChatML, Llama 3 and most others; the result is checked by rendering the probes again.

FastChat's system block is unconditional. A model template that writes a default system
message when none is given (Qwen2, Llama 3.1) is matched exactly; one that writes no
system block then (plain ChatML, Llama 3) gets the block with an empty system message, so
system messages are kept. A template that does not fit gets a plain USER:/ASSISTANT: one.
"""

from __future__ import annotations

import logging
from typing import Any

import jinja2

from services.tokenizer.tokenization import Tokenization

log = logging.getLogger(__name__)

# fastchat.conversation.SeparatorStyle values (FastChat is not a dependency of the server)
ADD_COLON_SINGLE = 1
NO_COLON_SINGLE = 4

# marker messages: letters only, so no template trims or escapes them
USER1, ASSISTANT1, USER2, SYSTEM = "lsUserOneQz", "lsAssistantOneQz", "lsUserTwoQz", "lsSystemQz"


def conversation(tok: Tokenization, name: str) -> dict[str, Any]:
    """FastChat's Conversation fields for the model's chat template."""
    try:
        conv = _probe(tok, name)
    except (ValueError, TypeError, KeyError, IndexError, jinja2.TemplateError) as e:
        log.warning("FastChat conversation template: the chat template could not be probed (%s)", e)
        conv = None
    if conv is None:
        log.warning("FastChat conversation template: the chat template does not fit FastChat's; using USER:/ASSISTANT:")
        return _template(f"{name}-plain", "{system_message}", "", ("USER", "ASSISTANT"), "\n", ADD_COLON_SINGLE)
    return conv


def render(conv: dict[str, Any], system: str, messages: list[str | None]) -> str:
    """FastChat's NO_COLON_SINGLE rendering (Conversation.get_prompt): user and assistant
    turns alternate, None is the turn to be generated."""
    out = conv["system_template"].format(system_message=system)
    for i, message in enumerate(messages):
        role = conv["roles"][i % 2]
        out += role + message + conv["sep"] if message else role
    return out


def _probe(tok: Tokenization, name: str) -> dict[str, Any] | None:
    lead = _lead(tok)

    def chat(*turns: tuple[str, str]) -> str:
        text = tok.render_chat([{"role": r, "content": c} for r, c in turns])
        # the worker tokenizes FastChat's prompt adding the tokenizer's own BOS, as FastChat's workers do
        return text.removeprefix(lead)

    one = chat(("user", USER1))
    two = chat(("user", USER1), ("assistant", ASSISTANT1), ("user", USER2))
    with_system = chat(("system", SYSTEM), ("user", USER1))
    parts = _split(two, [USER1, ASSISTANT1, USER2])
    if parts is None:
        return None
    head, after_user, after_assistant, tail = parts
    if after_user != tail:
        return None
    # after a user turn: sep + assistant role; after an assistant turn: sep + user role; the
    # first user turn: system block + user role. Every cut of their common start that leaves
    # the user role at the end of head renders the same; the natural one starts the roles
    # with a special token (<|im_start|>, <|start_header_id|>), else the shortest separator.
    common = _common_start(after_user, after_assistant)
    cuts = [k for k in range(len(common) + 1) if head.endswith(after_assistant[k:])]
    if not cuts:
        return None
    specials = [t for t in tok.hf.get_added_vocab() if t]
    natural = [k for k in cuts if after_assistant[k:].startswith(tuple(specials))]
    cut = max(natural) if natural else min(cuts)
    sep, user_role, assistant_role = common[:cut], after_assistant[cut:], after_user[cut:]
    system_none = head[: len(head) - len(user_role)]
    first_turn = user_role + USER1 + tail
    if not with_system.endswith(first_turn) or SYSTEM not in with_system[: -len(first_turn)]:
        return None
    left, _, right = with_system[: -len(first_turn)].partition(SYSTEM)
    system_template = _escape(left) + "{system_message}" + _escape(right)
    default = ""
    fits = system_none.startswith(left) and system_none.endswith(right) and len(system_none) >= len(left + right)
    if fits:
        default = system_none[len(left) : len(system_none) - len(right)]
    else:
        log.info("FastChat conversation template: chats without a system message get an empty one")
    conv = _template(f"{name}-chat-template", system_template, default, (user_role, assistant_role), sep)
    # the probes rendered again: exact, but for the empty system block where the model writes none
    system_block = system_none if fits else system_template.format(system_message="")
    expected = [
        (render(conv, SYSTEM, [USER1, None]), with_system),
        (render(conv, default, [USER1, None]), system_block + one[len(system_none) :]),
        (render(conv, default, [USER1, ASSISTANT1, USER2, None]), system_block + two[len(system_none) :]),
    ]
    return conv if all(got == want for got, want in expected) else None


def _lead(tok: Tokenization) -> str:
    """The text of the special tokens the tokenizer puts before every prompt (a BOS), if any."""
    bare = tok.hf.encode("x", add_special_tokens=False)
    full = tok.hf.encode("x", add_special_tokens=True)
    if len(full) <= len(bare) or full[len(full) - len(bare) :] != bare:
        return ""
    return tok.hf.decode(full[: len(full) - len(bare)], skip_special_tokens=False)


def _split(text: str, markers: list[str]) -> list[str] | None:
    """text = p0 + m0 + p1 + m1 + ... + pn: the pieces between the markers, or None."""
    pieces, at = [], 0
    for m in markers:
        i = text.find(m, at)
        if i < 0:
            return None
        pieces.append(text[at:i])
        at = i + len(m)
    pieces.append(text[at:])
    return pieces


def _common_start(a: str, b: str) -> str:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return a[:n]


def _escape(text: str) -> str:
    return text.replace("{", "{{").replace("}", "}}")


def _template(
    name: str, system_template: str, system_message: str, roles: tuple[str, str], sep: str, style: int = NO_COLON_SINGLE
) -> dict[str, Any]:
    return {
        "name": name,
        "system_template": system_template,
        "system_message": system_message,
        "roles": list(roles),
        "messages": [],
        "offset": 0,
        "sep_style": style,
        "sep": sep,
        "sep2": None,
        # no stops of its own: the model's end tokens end a turn, as on /v1/chat/completions
        "stop_str": None,
        "stop_token_ids": None,
    }
