"""DeepSeek-V4 chat format: prompt encoding, completion parsing, tokenizer, streaming detokenizer."""
from .detok import IncrementalDetokenizer
from .encoding import (
    ASSISTANT,
    BOS,
    DSML,
    EOS,
    LATEST_REMINDER,
    TASK_TOKENS,
    THINK_CLOSE,
    THINK_OPEN,
    USER,
    attach_tools,
    encode_messages,
    to_json,
)
from .parser import ChatParseError, StreamingParser, parse_completion, prompt_ends_in_reasoning
from .tokenizer import ChatTokenizer, load_tokenizer

__all__ = [
    "ASSISTANT", "BOS", "DSML", "EOS", "LATEST_REMINDER", "TASK_TOKENS", "THINK_CLOSE", "THINK_OPEN", "USER",
    "ChatParseError", "ChatTokenizer", "IncrementalDetokenizer", "StreamingParser",
    "attach_tools", "encode_messages", "load_tokenizer", "parse_completion", "prompt_ends_in_reasoning",
    "to_json",
]
