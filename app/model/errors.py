"""The one failure of a model call, chat or embeddings, below every layer that makes one."""

from __future__ import annotations


class ModelCallFailed(Exception):
    """A model call that gave no usable answer; ``status`` is the HTTP status when there was one,
    and ``prompt_tokens``/``completion_tokens`` what the server reported it cost (an answer
    that arrived but is not a JSON object was still paid for)."""

    def __init__(self, message: str, status: int | None = None, *,
                 prompt_tokens: int | None = None,
                 completion_tokens: int | None = None,
                 timed_out: bool = False) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        # No answer within the timeout (a caller in a request answers it apart: 504).
        self.timed_out = timed_out
        self.prompt_tokens = prompt_tokens
        self.completion_tokens = completion_tokens
