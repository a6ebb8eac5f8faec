"""What a run minimises and reports: cross-entropy over an image's classes, or over each next token of a sequence
(a language model's loss per token; its perplexity is e to that)."""

from __future__ import annotations

import math

import torch
from torch import nn


class Objective:
    """Summed cross-entropy and correct predictions of a batch, and how many predictions a sample holds (1 for an
    image, its length for a sequence): the loss is a mean over predictions, as the global batch's."""

    def __init__(self, text: bool, label_smoothing: float = 0.0, sequence_length: int = 1):
        self.text = text
        self.predictions_per_sample = sequence_length if text else 1
        self.criterion = nn.CrossEntropyLoss(reduction="sum", label_smoothing=label_smoothing)

    def __call__(self, logits: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(summed loss, correct predictions) of one batch; logits (N, C) against labels, or (N, T, V) against
        the next tokens."""
        if self.text:
            logits, y = logits.flatten(0, 1), y.flatten()
        return self.criterion(logits, y), (logits.argmax(-1) == y).sum()

    def loss(self, logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """The summed loss alone (what the planner's and auto's profiles back-propagate)."""
        return self(logits, y)[0]

    def evaluated(self, loss: float, accuracy: float) -> dict:
        """An evaluation's record: loss and accuracy, and for a language model its perplexity."""
        record = {"test_loss": loss, "test_acc": accuracy}
        if self.text:
            record["test_perplexity"] = math.exp(min(loss, 700.0))  # e^700 is near float64's largest
        return record


def throughput_key(text: bool) -> str:
    """The record's name for training throughput: images, or a language model's tokens, per second."""
    return "tokens_per_s" if text else "images_per_s"


def throughput(record: dict) -> tuple[float, str]:
    """A record's throughput and its unit (images/s, or tokens/s for a language model's)."""
    text = "tokens_per_s" in record
    return record[throughput_key(text)], "tokens/s" if text else "images/s"
