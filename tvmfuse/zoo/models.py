"""Real models, built offline from a config with random weights (nothing is downloaded).

Each builder returns a `Workload` (tvmfuse/zoo/workload.py, the zoo's type): the imported Relax `mod`,
deterministic `inputs()`, `reference()` from the framework the model came from (PyTorch eager, or
onnxruntime for the ONNX one), tolerances, and `eager(*inputs)` for timing PyTorch in the same run.

  bert-tiny       transformers BertModel, hidden 64, 2 layers, 2 heads, vocab 100   (torch.export)
  gpt2-tiny       transformers GPT2LMHeadModel, n_embd 64, 2 layers, 2 heads, use_cache=False
  llama-tiny      transformers LlamaForCausalLM, hidden 64, 2 layers, 4 query heads on 2 key/value
                  heads (grouped-query), rotary embeddings, RMSNorm, SiLU-gated MLP
  resnet-tiny     a ResNet-style conv net written here: stem, 2 basic blocks (one strided with a 1x1
                  projection), BatchNorm in inference mode, global average pool, linear head
  bert-tiny-onnx  bert-tiny exported with torch.onnx.export(dynamo=False), imported with from_onnx,
                  checked against onnxruntime

Full-size models, the configs' defaults (random weights, eager attention; batch 1 unless
`get(name, size, batch)` asks for more):
  bert-base       transformers BertModel(BertConfig()): hidden 768, 12 layers, 12 heads, vocab 30522
  gpt2-small      transformers GPT2LMHeadModel(GPT2Config(use_cache=False)): n_embd 768, 12 layers,
                  12 heads, the LM head onto the 50257-word vocabulary
  resnet50        transformers ResNetForImageClassification(ResNetConfig(num_labels=1000))
  mobilenet-v2    transformers MobileNetV2ForImageClassification(MobileNetV2Config()): depthwise 3x3
                  convs, ReLU6, TF "same" padding
  convnext-tiny   transformers ConvNextForImageClassification(ConvNextConfig()): depthwise 7x7 convs,
                  LayerNorm and the MLP channels-last, layer scale, GELU
  smollm-135m     SmolLM-135M's Llama architecture: hidden 576, 30 layers, 9 query heads on 3
                  key/value heads, vocab 49152, tied LM head
  vit-base        transformers ViTForImageClassification(ViTConfig()): 16x16 patches, hidden 768, 12
                  layers, 12 heads; 197 tokens at 224x224 (a ragged extent for every tile)

Sizes: "small" (tests: sequence 16, image 16x16; the full-size models image 64x64) and "bench"
(sequence 128, image 64x64; the full-size models 224x224).
"""
from __future__ import annotations

import io

import numpy as np

from ..errors import UnknownWorkloadError
from ..frontends.from_onnx import from_onnx
from ..frontends.from_torch import from_torch
from .workload import Workload

SEQ = {"small": 16, "bench": 128}
IMAGE = {"small": 16, "bench": 64}
FULL_IMAGE = {"small": 64, "bench": 224}
VOCAB = 100


def _torch():
    import torch

    torch.manual_seed(0)
    return torch


def _trained_like(module):
    """`module` with every parameter that its initializer left constant (transformers' zero biases,
    LayerNorm's ones, ConvNeXt's 1e-6 layer scale) spread by 2% of its value (of 1 for a zero), as
    training would leave it: build-time passes that drop identities (`x + 0`, `x * 1`,
    passes/shrink_constant_operands.py) then meet what a trained model holds, not an artifact of
    random initialization. Seeded by its own generator: the same module every time, and the global
    seed the builders set (_torch) left as they left it."""
    import torch

    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in module.parameters():
            flat = p.detach().reshape(-1)
            if flat.numel() and bool(torch.all(flat == flat[0])):
                scale = abs(float(flat[0])) or 1.0
                p.add_(torch.randn(p.shape, generator=gen, dtype=p.dtype) * (0.02 * scale))
    return module


def _bert_module(cfg=None):
    """transformers BertModel returning last_hidden_state; `cfg` None: the tiny config."""
    torch = _torch()
    from transformers import BertConfig, BertModel

    cfg = cfg or BertConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=2, intermediate_size=128,
                            vocab_size=VOCAB, max_position_embeddings=256, attn_implementation="eager")

    class Bert(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.bert = BertModel(cfg)

        def forward(self, input_ids):
            return self.bert(input_ids=input_ids).last_hidden_state

    return _trained_like(Bert().eval())


def _gpt2_module(cfg=None):
    """transformers GPT2LMHeadModel returning logits; `cfg` None: the tiny config."""
    torch = _torch()
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = cfg or GPT2Config(n_embd=64, n_layer=2, n_head=2, vocab_size=VOCAB, n_positions=256, use_cache=False,
                            bos_token_id=0, eos_token_id=0, attn_implementation="eager")

    class GPT2(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.gpt2 = GPT2LMHeadModel(cfg)

        def forward(self, input_ids):
            return self.gpt2(input_ids=input_ids, use_cache=False).logits

    return _trained_like(GPT2().eval())


def _llama_module(cfg=None):
    """transformers LlamaForCausalLM returning logits; `cfg` None: the tiny config (grouped-query:
    4 query heads on 2 key/value heads)."""
    torch = _torch()
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = cfg or LlamaConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                             use_cache=False, attn_implementation="eager")

    class Llama(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.llama = LlamaForCausalLM(cfg)

        def forward(self, input_ids):
            return self.llama(input_ids=input_ids, use_cache=False).logits

    return _trained_like(Llama().eval())


def _resnet_module():
    torch = _torch()
    nn = torch.nn

    class BasicBlock(nn.Module):
        def __init__(self, cin, cout, stride):
            super().__init__()
            self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
            self.bn1 = nn.BatchNorm2d(cout)
            self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
            self.bn2 = nn.BatchNorm2d(cout)
            self.down = None
            if stride != 1 or cin != cout:
                self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

        def forward(self, x):
            y = torch.relu(self.bn1(self.conv1(x)))
            y = self.bn2(self.conv2(y))
            return torch.relu(y + (x if self.down is None else self.down(x)))

    class ResNetTiny(nn.Module):
        def __init__(self):
            super().__init__()
            self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, 1, 1, bias=False), nn.BatchNorm2d(16), nn.ReLU())
            self.layer1 = BasicBlock(16, 16, 1)
            self.layer2 = BasicBlock(16, 32, 2)
            self.fc = nn.Linear(32, 10)

        def forward(self, x):
            x = self.layer2(self.layer1(self.stem(x)))
            return self.fc(x.mean(dim=(2, 3)))

    net = ResNetTiny()
    with torch.no_grad():  # non-trivial BatchNorm statistics, so inference BN is not an identity
        for m in net.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.running_mean.normal_(0, 0.1)
                m.running_var.uniform_(0.5, 1.5)
                m.weight.uniform_(0.5, 1.5)
                m.bias.normal_(0, 0.1)
    return _trained_like(net.eval())


def _image_classifier(kind, **config):
    """A transformers image classifier with its default config (1000 classes) updated by `config`,
    logits out."""
    torch = _torch()
    import transformers

    config = getattr(transformers, f"{kind}Config")(num_labels=1000, **config)
    model = getattr(transformers, f"{kind}ForImageClassification")

    class Classifier(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.net = model(config)

        def forward(self, pixel_values):
            return self.net(pixel_values=pixel_values).logits

    net = Classifier()
    with torch.no_grad():  # non-trivial BatchNorm statistics, so inference BN is not an identity
        for m in net.modules():
            if isinstance(m, torch.nn.BatchNorm2d):
                m.running_mean.normal_(0, 0.1)
                m.running_var.uniform_(0.5, 1.5)
    return _trained_like(net.eval())


def _ids(size, vocab=VOCAB, batch=1):
    return np.random.default_rng(0).integers(0, vocab, size=(batch, SEQ[size])).astype("int64")


def _torch_model(name, module, arrays, size, rtol=1e-4, atol=1e-4):
    torch = _torch()
    tensors = tuple(torch.from_numpy(a) for a in arrays)
    mod = from_torch(module, tensors)

    def eager(*inputs):
        with torch.inference_mode():
            return module(*[torch.from_numpy(np.ascontiguousarray(a)) for a in inputs])

    def reference(*inputs):
        return eager(*inputs).numpy()

    return Workload.imported(name, mod, arrays, reference, rtol=rtol, atol=atol, size=size, eager=eager,
                             source="torch.export", module=module)


def bert_tiny(size="small", batch=1):
    return _torch_model("bert-tiny", _bert_module(), [_ids(size, batch=batch)], size)


def gpt2_tiny(size="small", batch=1):
    return _torch_model("gpt2-tiny", _gpt2_module(), [_ids(size, batch=batch)], size)


def resnet_tiny(size="small", batch=1):
    x = np.random.default_rng(0).standard_normal((batch, 3, IMAGE[size], IMAGE[size])).astype("float32")
    return _torch_model("resnet-tiny", _resnet_module(), [x], size)


def llama_tiny(size="small", batch=1):
    return _torch_model("llama-tiny", _llama_module(), [_ids(size, batch=batch)], size)


def bert_base(size="bench", batch=1):
    from transformers import BertConfig

    module = _bert_module(BertConfig(attn_implementation="eager"))
    return _torch_model("bert-base", module, [_ids(size, 30522, batch)], size, rtol=1e-3, atol=1e-3)


def gpt2_small(size="bench", batch=1):
    from transformers import GPT2Config

    module = _gpt2_module(GPT2Config(use_cache=False, attn_implementation="eager"))
    return _torch_model("gpt2-small", module, [_ids(size, 50257, batch)], size, rtol=1e-3, atol=1e-3)


def smollm_135m(size="bench", batch=1):
    """SmolLM-135M's architecture (HuggingFaceTB/SmolLM-135M's config.json, random weights): a Llama
    with grouped-query attention (9 query heads share 3 key/value heads), rotary position
    embeddings, RMSNorm, a SiLU-gated MLP and the LM head tied to the 49152-word embedding."""
    from transformers import LlamaConfig

    cfg = LlamaConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                      num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=2048, rms_norm_eps=1e-5,
                      rope_theta=10000.0, tie_word_embeddings=True, use_cache=False, attn_implementation="eager")
    return _torch_model("smollm-135m", _llama_module(cfg), [_ids(size, 49152, batch)], size, rtol=1e-3, atol=1e-3)


def _image(size, batch=1):
    n = FULL_IMAGE[size]
    return np.random.default_rng(0).standard_normal((batch, 3, n, n)).astype("float32")


def resnet50(size="bench", batch=1):
    return _torch_model("resnet50", _image_classifier("ResNet"), [_image(size, batch)], size, rtol=1e-3, atol=1e-3)


def mobilenet_v2(size="bench", batch=1):
    return _torch_model("mobilenet-v2", _image_classifier("MobileNetV2"), [_image(size, batch)], size, rtol=1e-3,
                        atol=1e-3)


def convnext_tiny(size="bench", batch=1):
    return _torch_model("convnext-tiny", _image_classifier("ConvNext"), [_image(size, batch)], size, rtol=1e-3,
                        atol=1e-3)


def vit_base(size="bench", batch=1):
    n = FULL_IMAGE[size]  # the patch grid follows the image: 14 x 14 patches + [CLS] = 197 tokens at 224
    module = _image_classifier("ViT", image_size=n, attn_implementation="eager")
    return _torch_model("vit-base", module, [_image(size, batch)], size, rtol=1e-3, atol=1e-3)


def export_onnx(module, arrays, names) -> bytes:
    """torch.onnx.export with the TorchScript exporter (dynamo=False: no onnxscript needed)."""
    import warnings

    torch = _torch()
    buf = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(module, tuple(torch.from_numpy(a) for a in arrays), buf, input_names=names,
                          output_names=["output"], opset_version=17, dynamo=False)
    return buf.getvalue()


def bert_tiny_onnx(size="small", batch=1):
    import onnx
    import onnxruntime as ort

    module, arrays = _bert_module(), [_ids(size, batch=batch)]
    blob = export_onnx(module, arrays, ["input_ids"])
    mod = from_onnx(onnx.load_from_string(blob))
    sess = ort.InferenceSession(blob, providers=["CPUExecutionProvider"])

    def reference(*inputs):
        return sess.run(None, {"input_ids": inputs[0]})[0]

    torch = _torch()

    def eager(*inputs):
        with torch.inference_mode():
            return module(*[torch.from_numpy(a) for a in inputs])

    return Workload.imported("bert-tiny-onnx", mod, arrays, reference, rtol=1e-4, atol=1e-4, size=size,
                             eager=eager, source="torch.onnx.export -> from_onnx (reference: onnxruntime)")


MODELS = {"bert-tiny": bert_tiny, "gpt2-tiny": gpt2_tiny, "llama-tiny": llama_tiny, "resnet-tiny": resnet_tiny,
          "bert-tiny-onnx": bert_tiny_onnx, "bert-base": bert_base, "gpt2-small": gpt2_small,
          "resnet50": resnet50, "mobilenet-v2": mobilenet_v2, "convnext-tiny": convnext_tiny, "vit-base": vit_base,
          "smollm-135m": smollm_135m}
FULL_SIZE = ("bert-base", "gpt2-small", "resnet50", "mobilenet-v2", "convnext-tiny", "vit-base", "smollm-135m")
ATTENTION_LAYERS = {"bert-base": 12, "gpt2-small": 12, "vit-base": 12, "smollm-135m": 30}  # one fused attention kernel per layer


def names() -> list[str]:
    return list(MODELS)


def get(name: str, size: str = "small", batch: int = 1) -> Workload:
    """Model `name` at `size`, its inputs `batch` deep (the batch is a static dimension of the import)."""
    if name not in MODELS:
        raise UnknownWorkloadError(f"unknown model {name!r}; known models: {', '.join(MODELS)}")
    if size not in SEQ:
        raise UnknownWorkloadError(f"unknown size {size!r} for model {name!r}; use one of {tuple(SEQ)}")
    if not isinstance(batch, int) or batch < 1:
        raise UnknownWorkloadError(f"batch {batch!r} for model {name!r}: use a whole number of 1 or more")
    return MODELS[name](size, batch)
