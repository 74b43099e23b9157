"""jaxlm.models: the networks of every family, their config and named presets, the fine-tuning heads and
the linear-chain CRF."""
from jaxlm.models.config import TransformerConfig
from jaxlm.models.presets import PRESETS, model_config
from jaxlm.models.encoder import BertEncoder
from jaxlm.models.heads import BertForPreTraining, MaskedLM
from jaxlm.models.albert import AlbertEncoder, AlbertForPreTraining
from jaxlm.models.spanbert import SpanBertForPreTraining, SpanBoundaryHead
from jaxlm.models.decoder import CausalLM, Decoder
from jaxlm.models.seq2seq import EncoderDecoder
from jaxlm.models.t5 import T5ForConditionalGeneration
from jaxlm.models.bart import BartForConditionalGeneration, shift_tokens_right
from jaxlm.models.task_heads import (CrfTagger, DecoderClassifier, MultipleChoice, QuestionAnswering,
                                    SequenceClassifier, SpanLabeller, TokenClassifier)
from jaxlm.models.sentence_bert import SentenceEncoder, SiameseClassifier
from jaxlm.models.crf import CRF, crf_decode, crf_log_likelihood

__all__ = ["CRF", "PRESETS", "AlbertEncoder", "AlbertForPreTraining", "BartForConditionalGeneration", "BertEncoder",
           "BertForPreTraining", "CausalLM", "CrfTagger", "Decoder", "DecoderClassifier", "EncoderDecoder", "MaskedLM",
           "MultipleChoice", "QuestionAnswering", "SentenceEncoder", "SequenceClassifier", "SiameseClassifier",
           "SpanBertForPreTraining", "SpanBoundaryHead", "SpanLabeller", "T5ForConditionalGeneration", "TokenClassifier",
           "TransformerConfig", "crf_decode", "crf_log_likelihood", "model_config", "shift_tokens_right"]
