"""jaxlm.models: the networks, their config and named presets."""
from jaxlm.models.config import TransformerConfig
from jaxlm.models.presets import PRESETS, model_config
from jaxlm.models.encoder import BertEncoder
from jaxlm.models.heads import BertForPreTraining, MaskedLM
from jaxlm.models.decoder import CausalLM, Decoder

__all__ = ["PRESETS", "BertEncoder", "BertForPreTraining", "CausalLM", "Decoder", "MaskedLM",
           "TransformerConfig", "model_config"]
