"""The sim's tokenizer: the same word-level tokenizer llama-benchy loads with `--tokenizer`.

Counting prompt tokens with the tokenizer the client used is what makes usage.prompt_tokens equal what
llama-benchy thinks it sent (it adapts the prompt by the difference it sees at warm-up, and discards
the server's count when it is more than 20% off). Every served model uses this one tokenizer: the sim
has no weights, so a model's real vocabulary would change nothing but the counts.

Files: data/tokenizer/{tokenizer.json,tokenizer_config.json} (AutoTokenizer-loadable), built by
tools/make_data.py. The chat format is the Jinja template in tokenizer_config.json, rendered here in
Python (a test checks both render the same).
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Any

DATA_DIR = Path(__file__).resolve().parent / "data"
TOKENIZER_DIR = DATA_DIR / "tokenizer"
CORPUS_FILE = DATA_DIR / "corpus.txt"


def _content_text(content: Any) -> str:
    """OpenAI content may be a string or a list of parts; the sim keeps the text parts."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict) and p.get("type") == "text")
    return str(content)


class SimTokenizer:
    def __init__(self, path: Path = TOKENIZER_DIR):
        from tokenizers import Tokenizer

        self._tok = Tokenizer.from_file(str(Path(path) / "tokenizer.json"))
        self.eos_token_id = self._tok.token_to_id("<|endoftext|>")

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text, add_special_tokens=False).ids

    def decode(self, ids: list[int]) -> str:
        return self._tok.decode(list(ids), skip_special_tokens=False)

    def piece_id(self, piece: str) -> int:
        """The id of a scripted piece of text: the word's own id, or <unk> (markup is not in the vocabulary)."""
        tid = self._tok.token_to_id(piece.strip())
        return self._tok.token_to_id("<unk>") if tid is None else tid

    def token_id(self, word: str) -> int:
        tid = self._tok.token_to_id(word)
        if tid is None:
            raise KeyError(f"{word!r} is not in the sim vocabulary")
        return tid

    @staticmethod
    def render_chat(messages: list[dict[str, Any]], add_generation_prompt: bool = True) -> str:
        parts = [
            f"<|start|>{m.get('role', 'user')}<|message|>{_content_text(m.get('content'))}<|end|>" for m in messages
        ]
        if add_generation_prompt:
            parts.append("<|start|>assistant<|message|>")
        return "".join(parts)


@lru_cache(maxsize=1)
def default_tokenizer() -> SimTokenizer:
    return SimTokenizer()
