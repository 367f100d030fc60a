"""Reference DeepSeek-V4 model (CPU torch; the reference every kernel is tested against)."""
from dsv4.model.context import ForwardContext, get_forward_context, set_forward_context
from dsv4.model.deepseek_v4 import DeepseekV4ForCausalLM
from dsv4.model.load import load_model
from dsv4.model.numerics import NUMERICS, Numerics
from dsv4.model.state import LayerState, SequenceState

__all__ = ["DeepseekV4ForCausalLM", "ForwardContext", "set_forward_context", "get_forward_context",
           "SequenceState", "LayerState", "Numerics", "NUMERICS", "load_model"]
