"""Sequence-to-sequence denoising loss for T5 and BART: corrupted input in, targets out."""
from __future__ import annotations

import dataclasses

from jaxlm.objectives.base import FLOAT, INT, Field, Objective, layer_matmul_params
from jaxlm.objectives.causal import token_stats, token_summary


@dataclasses.dataclass(frozen=True)
class Seq2SeqObjective(Objective):
    """Encoder input [max_seq_length] with its mask; decoder input, targets and weights [max_target_length]."""

    max_target_length: int = 0

    @property
    def target_length(self) -> int:
        return self.max_target_length or self.max_seq_length

    def fields(self):
        seq, target = self.max_seq_length, self.target_length
        return {"input_ids": Field((seq,), INT, ("length",)), "input_mask": Field((seq,), INT, ("length",)),
                "decoder_input_ids": Field((target,), INT, ("length",)),
                "targets": Field((target,), INT, ("length",)), "target_weights": Field((target,), FLOAT, ("length",))}

    @staticmethod
    def model_inputs(batch):
        return batch["input_ids"], batch["decoder_input_ids"], batch["input_mask"]

    def stats(self, params, batch, rng, deterministic: bool = False) -> dict:
        return token_stats(self.apply(params, batch, rng, deterministic), batch)

    def summarize(self, stats: dict) -> dict:
        return token_summary(stats)

    def flops_per_token(self) -> float:
        """Per encoder token: the encoder's 6·N + 12·L·d·T plus the decoder's work spread over them
        (causal self-attention over the targets, cross-attention over the inputs, the LM head)."""
        c, seq, target = self.config, self.max_seq_length, self.target_length
        encoder = 6 * c.num_layers * layer_matmul_params(c) + 12 * c.num_layers * c.hidden_size * seq
        decoder = (6 * (c.decoder_layers * layer_matmul_params(c, cross_attention=True) + c.hidden_size * c.vocab_size)
                   + 6 * c.decoder_layers * c.hidden_size * target + 12 * c.decoder_layers * c.hidden_size * seq)
        return encoder + decoder * target / seq
