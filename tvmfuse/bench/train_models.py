"""The training benchmark's models and optimizers (tvmfuse/bench/train.py): an MLP (Linear, GELU,
Linear, LayerNorm), a 2-layer BERT (hidden 256, seq 128, batch 4, dropout 0) and resnet-tiny, each
with SGD (momentum 0.9) and AdamW, as in tests/test_torch_training.py."""
from __future__ import annotations


def _mlp(torch):
    class MLP(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.l1, self.act = torch.nn.Linear(32, 64), torch.nn.GELU()
            self.l2, self.ln = torch.nn.Linear(64, 32), torch.nn.LayerNorm(32)

        def forward(self, x):
            return self.ln(self.l2(self.act(self.l1(x))))

    return MLP(), torch.randn(8, 32)


def _bert(torch):
    from transformers import BertConfig, BertModel

    class Bert(torch.nn.Module):
        """transformers BertModel, hidden 256, 2 layers, 4 heads, intermediate 1024, dropout 0."""

        def __init__(self):
            super().__init__()
            cfg = BertConfig(hidden_size=256, num_hidden_layers=2, num_attention_heads=4, intermediate_size=1024,
                             vocab_size=1000, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
                             attn_implementation="eager")
            self.bert = BertModel(cfg)

        def forward(self, ids):
            return self.bert(input_ids=ids).last_hidden_state

    return Bert(), torch.randint(0, 1000, (4, 128))


def _resnet(torch):
    from ..zoo.models import _resnet_module

    return _resnet_module(), torch.randn(4, 3, 16, 16)


MODELS = {"mlp": _mlp, "bert-small": _bert, "resnet-tiny": _resnet}  # name -> (module, input)
OPTIMIZERS = {"sgd": lambda torch, p: torch.optim.SGD(p, lr=0.05, momentum=0.9),
              "adamw": lambda torch, p: torch.optim.AdamW(p, lr=1e-3)}


def model(name: str):
    """(train-mode module, input), seeded: every system starts from the same weights and batch."""
    import torch

    torch.manual_seed(0)
    module, x = MODELS[name](torch)
    return module.train(), x
