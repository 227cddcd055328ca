"""task.template: every input text wrapped the same way wherever it meets the base.

    task.template: chat                               # the base tokenizer's chat template: the text is
    task.add_generation_prompt: true                  #   one user message (+ the assistant turn's opening)
    task.template: "Review: {text}\\nSentiment:"       # a format string (str.format; {{ }} for braces)
    task.template: "Q1: {text}\\nQ2: {text_pair}\\nSame?"   # sentence pairs: both texts in one string

Template.apply(tokenizer, texts, pairs) is the one place a text is wrapped; training (encode,
choose_max_length), `adalayers predict`, SideTasks.predict (serve, Ray Serve, predict-files) and
SideTasks.generate all call it, so a head always reads what it was trained on. The wrapped text is
then tokenized as usual (special tokens included). A chat template usually writes the BOS token
itself (Gemma's does); when the tokenizer also prepends one, the template's leading BOS is
dropped, so a text never starts with two. A pair template turns the pair into one text (the
tokenizer's pair encoding is not used). Off (None) by default: texts run as given, except that a pair on
a base whose tokenizer has no separator token (a decoder's) is read as one text, text + "\n" + text_pair
(task.pair_separator), not as the tokenizer's pair encoding (Gemma's puts a second BOS between the texts).

Token tasks take no template: their heads tag the words of the text as given, and a template
would add words (and move every character offset) that no tag belongs to.
"""
from __future__ import annotations

import weakref
from dataclasses import dataclass
from functools import wraps
from pathlib import Path

from adalayers.errors import ConfigError, DataError, ModelError
from adalayers.kinds import TaskKind
from adalayers.template_spec import EXAMPLE, FIELDS, fields, spec_problem  # noqa: F401  (re-exported)

@dataclass(frozen=True)
class Template:
    spec: str | None = None            # None (off), "chat", or a format string
    add_generation_prompt: bool = True  # chat only: end with the opening of the assistant's turn
    pair_separator: str | None = "\n"  # off, pairs, a tokenizer without a separator: text + this + text_pair

    @classmethod
    def of(cls, cfg) -> "Template":
        return cls(cfg.task.template, bool(cfg.task.add_generation_prompt), cfg.task.pair_separator)

    @property
    def on(self) -> bool:
        return self.spec is not None

    @property
    def takes_pairs(self) -> bool:
        return self.on and self.spec != "chat" and "text_pair" in fields(self.spec)

    def key(self) -> dict | None:
        """What the wrapped text depends on besides the tokenizer (part of the hidden-state cache key)."""
        if not self.on:
            return None
        return {"template": self.spec, **({"add_generation_prompt": self.add_generation_prompt}
                                          if self.spec == "chat" else {})}

    def describe(self) -> str:
        return "no task.template" if not self.on else f"task.template {self.spec!r}" + (
            f" (add_generation_prompt {self.add_generation_prompt})" if self.spec == "chat" else "")

    def check(self, tokenizer, base: str, pairs: bool, kind: str) -> None:
        """Refuse, in one line, a template that cannot apply to this task or base."""
        if not self.on:
            return
        problem = spec_problem(self.spec)
        if problem:
            raise ConfigError(f"task.template: {problem}")
        if kind == TaskKind.TOKENS:
            raise ConfigError("task.template: token tasks take no template (their heads tag the words of the text "
                              "as given); leave task.template unset")
        if self.spec == "chat" and pairs:
            raise ConfigError("task.template: chat wraps one text; for sentence pairs give a format string with "
                              "{text} and {text_pair}")
        if pairs and not self.takes_pairs:
            raise ConfigError("task.template: a sentence-pair task needs {text_pair} in its template, e.g. "
                              "'Q1: {text}\\nQ2: {text_pair}'")
        if not pairs and self.takes_pairs:
            raise ConfigError("task.template: {text_pair} is for sentence-pair tasks, and this task has single texts")
        if self.spec == "chat" and not getattr(tokenizer, "chat_template", None):
            raise ModelError(f"task.template: chat, but the tokenizer of {base} has no chat template; give a "
                             f"format string instead, e.g. {EXAMPLE}")

    def apply(self, tokenizer, texts: list[str], pairs: list[str] | None = None
              ) -> tuple[list[str], list[str] | None]:
        """(texts, pairs) as the base reads them: unchanged when off (a pair joined by pair_separator when the
        tokenizer has no separator of its own: joins_pairs); else one wrapped string each, no pairs."""
        if not self.on:
            if pairs is not None and self.pair_separator is not None and joins_pairs(tokenizer):
                return [t + self.pair_separator + p for t, p in zip(texts, pairs)], None
            return list(texts), pairs
        if (pairs is not None) != self.takes_pairs:
            raise DataError(f"{self.describe()} takes {'sentence pairs' if self.takes_pairs else 'single texts'}, "
                            f"got {'single texts' if pairs is None else 'sentence pairs'}")
        if self.spec != "chat":
            return [self.spec.format(text=t, text_pair=p) for t, p in zip(texts, pairs or [None] * len(texts))], None
        try:
            return [chat_text(tokenizer, [{"role": "user", "content": t}], self.add_generation_prompt)
                    for t in texts], None
        except ModelError as e:
            raise ModelError(f"task.template: {e}") from None


def _once_per_tokenizer(probe):
    """Remember a probe's answer for each tokenizer object: Template.apply asks on every served request,
    and the answer (found by tokenizing a tiny text) cannot change while the tokenizer lives."""
    answers: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    @wraps(probe)
    def cached(tokenizer) -> bool:
        try:
            return answers[tokenizer]
        except KeyError:
            answer = answers[tokenizer] = probe(tokenizer)
            return answer
        except TypeError:  # an object that takes no weak reference (a test double): ask every time
            return probe(tokenizer)
    return cached


@_once_per_tokenizer
def joins_pairs(tokenizer) -> bool:
    """Has the tokenizer no separator token of its own between a pair's texts? Encoders' pair encodings put
    [SEP] or </s> there, and their models were trained on it; a decoder's tokenizer has none (Gemma's puts a
    second BOS, whose state is as outsized as the first's; Qwen's and GPT-2's put nothing, not even a space)."""
    sep = getattr(tokenizer, "sep_token_id", None)
    return sep is None or sep not in tokenizer("a", "b")["input_ids"]


@_once_per_tokenizer
def prepends_bos(tokenizer) -> bool:
    """Does the tokenizer put a BOS token before every text (Gemma, Llama do; GPT-2, Qwen do not)?"""
    bos = getattr(tokenizer, "bos_token_id", None)
    if bos is None:
        return False
    ids = tokenizer("a")["input_ids"]
    return bool(ids) and ids[0] == bos


def chat_text(tokenizer, messages: list[dict], add_generation_prompt: bool = True, template: str | None = None) -> str:
    """A conversation ([{"role", "content"}, ...]) as the base reads it: the tokenizer's chat template (or
    `template`, a Jinja chat template given instead), with the template's leading BOS dropped when the
    tokenizer prepends one itself (never two). Used by task.template chat and the service's chat completions."""
    if not template and not getattr(tokenizer, "chat_template", None):
        raise ModelError("the tokenizer has no chat template (adalayers serve --chat-template FILE gives one)")
    try:
        s = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt,
                                          **({"chat_template": template} if template else {}))
    except Exception as e:  # noqa: BLE001  (jinja raises its own error types)
        raise ModelError(f"the tokenizer's chat template fails: {type(e).__name__}: "
                         f"{str(e).splitlines()[0] if str(e) else ''}") from None
    bos = tokenizer.bos_token if prepends_bos(tokenizer) else None
    return s[len(bos):] if bos and s.startswith(bos) else s


def read_chat_template(path: str | None) -> str | None:
    """The Jinja chat template in the file `path` (None: none given); ConfigError when it cannot be read."""
    if path is None:
        return None
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"--chat-template {path}: cannot read it ({e.__class__.__name__}: {e})") from None
    if "{{" not in text and "{%" not in text:
        raise ConfigError(f"--chat-template {path}: not a Jinja template (no {{{{ }}}} or {{% %}} in it)")
    return text
