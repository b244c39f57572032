"""The suite's architectures: one `Arch` per transformers model class, built offline from its config.

Every entry names a transformers config class (`<kind>Config`); the model is
`AutoModel.from_config(config, attn_implementation="eager")` (the base model, no task head; random
weights, nothing downloaded), wrapped so that forward takes positional tensors and returns the
first output (last_hidden_state, or the CNNs' last feature map).

Sizes:
  full  the config's defaults (`XConfig()`), updated by `full` where the default is a multi-billion
        parameter model nobody runs on a CPU: there the architecture gets the dimensions of the small
        checkpoint users do run (stated in `note`, e.g. SmolLM-135M's dims for Llama).
  tiny  the same architecture with 1 layer (or 1 block per stage), widths 16-64, 2 heads, vocab 128,
        images 32x32, sequences 8 and audio clips of a few hundred samples: the CI slice.

Inputs (`make_inputs`): token ids (seq 8 tiny / 128 full), encoder-decoders add one decoder token
(one decoder step), images 32x32 / 224x224, raw audio 400 / 16000 samples, log-mel features of the
config's length; deterministic (numpy seed 0), at any batch.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

VOCAB = 128
SEQ = {"tiny": 8, "full": 128}
IMAGE = {"tiny": 32, "full": 224}
AUDIO = {"tiny": 400, "full": 16000}

# the tiny text transformer: 1 layer, hidden 32, 2 heads
_T = dict(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
          max_position_embeddings=64)
# the tiny LLM: grouped-query attention (2 query heads on 1 key/value head), head_dim 16
_L = dict(_T, num_key_value_heads=1, head_dim=16)
_VIT = dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64, image_size=32,
            patch_size=8)
_BART = dict(vocab_size=VOCAB, d_model=32, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2,
             decoder_attention_heads=2, encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=64)
_T5 = dict(vocab_size=VOCAB, d_model=32, d_kv=16, d_ff=64, num_layers=1, num_decoder_layers=1, num_heads=2)
_W2V = dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64, conv_dim=(16, 16),
            conv_stride=(5, 2), conv_kernel=(10, 3), num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=2)
# SmolLM-135M's dims (HuggingFaceTB/SmolLM-135M config.json) for LLMs whose default is billions
_SMOL = dict(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
             num_key_value_heads=3, head_dim=64, max_position_embeddings=2048, tie_word_embeddings=True)
_GPT_125M = dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12)


@dataclass(frozen=True)
class Arch:
    name: str
    kind: str  # transformers' prefix: <kind>Config
    family: str
    inputs: str  # ids | seq2seq | image | audio | mel | ast
    tiny: dict = field(default_factory=dict)
    full: dict = field(default_factory=dict)
    note: str = ""


def _a(name, kind, family, inputs, tiny, full=None, note=""):
    return Arch(name, kind, family, inputs, dict(tiny), dict(full or {}), note)


ARCHS = [
    # encoders
    _a("bert", "Bert", "encoder", "ids", _T),
    _a("roberta", "Roberta", "encoder", "ids", _T),
    _a("distilbert", "DistilBert", "encoder", "ids",
       dict(vocab_size=VOCAB, dim=32, n_layers=1, n_heads=2, hidden_dim=64, max_position_embeddings=64)),
    _a("albert", "Albert", "encoder", "ids", dict(_T, embedding_size=16),
       dict(hidden_size=768, num_attention_heads=12, intermediate_size=3072), "albert-base-v2 dims"),
    _a("electra", "Electra", "encoder", "ids", dict(_T, embedding_size=16)),
    _a("deberta-v2", "DebertaV2", "encoder", "ids",
       dict(_T, relative_attention=True, position_buckets=8, max_relative_positions=-1, pos_att_type=["p2c", "c2p"],
            position_biased_input=False, norm_rel_ebd="layer_norm", share_att_key=True),
       dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072, vocab_size=128100,
            relative_attention=True, position_buckets=256, max_relative_positions=-1, pos_att_type=["p2c", "c2p"],
            position_biased_input=False, norm_rel_ebd="layer_norm", share_att_key=True),
       "deberta-v3-base dims (the default config is xlarge)"),
    _a("xlm-roberta", "XLMRoberta", "encoder", "ids", _T),
    _a("mpnet", "MPNet", "encoder", "ids", _T),
    _a("roformer", "RoFormer", "encoder", "ids", dict(_T, embedding_size=32)),
    _a("convbert", "ConvBert", "encoder", "ids", dict(_T, embedding_size=32, head_ratio=2, conv_kernel_size=3)),
    # decoders
    _a("gpt2", "GPT2", "decoder", "ids", dict(vocab_size=VOCAB, n_embd=32, n_layer=1, n_head=2, n_positions=64, bos_token_id=0,
                                                 eos_token_id=0)),
    _a("gpt-neo", "GPTNeo", "decoder", "ids",
       dict(vocab_size=VOCAB, hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64,
            attention_types=[[["global", "local"], 1]], window_size=4, max_position_embeddings=64),
       dict(hidden_size=768, num_layers=12, num_heads=12, attention_types=[[["global", "local"], 6]]),
       "gpt-neo-125M dims (the default config is 1.3B)"),
    _a("opt", "OPT", "decoder", "ids", dict(_T, ffn_dim=64, word_embed_proj_dim=32)),
    _a("bloom", "Bloom", "decoder", "ids", dict(vocab_size=VOCAB, hidden_size=32, n_layer=1, n_head=2),
       dict(hidden_size=1024, n_layer=24, n_head=16), "bloom-560m dims (ALiBi)"),
    _a("falcon", "Falcon", "decoder", "ids", dict(_T, num_kv_heads=1, new_decoder_architecture=False),
       dict(_GPT_125M, vocab_size=65024), "Falcon's block at 125M-class dims (the default is 7B)"),
    _a("gpt-j", "GPTJ", "decoder", "ids",
       dict(vocab_size=VOCAB, n_embd=32, n_layer=1, n_head=2, rotary_dim=8, n_positions=64),
       dict(n_embd=768, n_layer=12, n_head=12, rotary_dim=32), "GPT-J's block at 125M-class dims (default 6B)"),
    _a("gpt-neox", "GPTNeoX", "decoder", "ids", _T,
       dict(_GPT_125M, intermediate_size=3072, vocab_size=50304), "pythia-160m dims (default 20B)"),
    _a("codegen", "CodeGen", "decoder", "ids",
       dict(vocab_size=VOCAB, n_embd=32, n_layer=1, n_head=2, rotary_dim=8, n_positions=64, n_ctx=64),
       dict(n_embd=1024, n_layer=20, n_head=16, rotary_dim=32, vocab_size=51200), "codegen-350M dims"),
    _a("biogpt", "BioGpt", "decoder", "ids", _T, dict(_GPT_125M, intermediate_size=3072), "125M-class dims"),
    # encoder-decoders: the encoder and one decoder step
    _a("t5", "T5", "encoder-decoder", "seq2seq", _T5),
    _a("mt5", "MT5", "encoder-decoder", "seq2seq", _T5),
    _a("bart", "Bart", "encoder-decoder", "seq2seq", _BART,
       dict(d_model=768, encoder_layers=6, decoder_layers=6, encoder_attention_heads=12, decoder_attention_heads=12,
            encoder_ffn_dim=3072, decoder_ffn_dim=3072), "bart-base dims (the default is bart-large)"),
    _a("marian", "Marian", "encoder-decoder", "seq2seq",
       dict(_BART, pad_token_id=1, eos_token_id=2, decoder_start_token_id=1)),
    _a("pegasus", "Pegasus", "encoder-decoder", "seq2seq", _BART,
       dict(d_model=512, encoder_layers=6, decoder_layers=6, encoder_attention_heads=8, decoder_attention_heads=8,
            encoder_ffn_dim=2048, decoder_ffn_dim=2048), "6+6 layers, d_model 512 (the default is pegasus-large)"),
    # vision transformers
    _a("vit", "ViT", "vision-transformer", "image", _VIT),
    _a("deit", "DeiT", "vision-transformer", "image", _VIT),
    _a("beit", "Beit", "vision-transformer", "image", dict(_VIT, use_relative_position_bias=True)),
    _a("dinov2", "Dinov2", "vision-transformer", "image", _VIT, dict(image_size=224),
       "image_size 224 (the default 518 grid would be interpolated bicubically at 224)"),
    _a("data2vec-vision", "Data2VecVision", "vision-transformer", "image", _VIT),
    # hierarchical / windowed vision
    _a("swin", "Swin", "hierarchical-vision", "image",
       dict(image_size=32, patch_size=4, embed_dim=16, depths=[1, 1], num_heads=[1, 2], window_size=4)),
    _a("swinv2", "Swinv2", "hierarchical-vision", "image",
       dict(image_size=32, patch_size=4, embed_dim=16, depths=[1, 1], num_heads=[1, 2], window_size=4)),
    _a("convnext", "ConvNext", "hierarchical-vision", "image", dict(num_stages=2, hidden_sizes=[16, 32], depths=[1, 1])),
    _a("convnextv2", "ConvNextV2", "hierarchical-vision", "image",
       dict(num_stages=2, hidden_sizes=[16, 32], depths=[1, 1])),
    _a("poolformer", "PoolFormer", "hierarchical-vision", "image",
       dict(num_encoder_blocks=2, depths=[1, 1], hidden_sizes=[16, 32], patch_sizes=[7, 3], strides=[4, 2],
            padding=[2, 1])),
    _a("segformer", "Segformer", "hierarchical-vision", "image",
       dict(num_encoder_blocks=2, depths=[1, 1], sr_ratios=[2, 1], hidden_sizes=[16, 32], patch_sizes=[7, 3],
            strides=[4, 2], num_attention_heads=[1, 2], mlp_ratios=[2, 2])),
    # CNNs: depthwise convs, squeeze-excitation, SiLU / ReLU6
    _a("resnet", "ResNet", "cnn", "image", dict(embedding_size=16, hidden_sizes=[16, 32], depths=[1, 1],
                                                layer_type="basic")),
    _a("mobilenet-v1", "MobileNetV1", "cnn", "image", dict(depth_multiplier=0.25, image_size=32)),
    _a("mobilenet-v2", "MobileNetV2", "cnn", "image", dict(depth_multiplier=0.25, image_size=32)),
    _a("efficientnet", "EfficientNet", "cnn", "image",
       dict(width_coefficient=0.25, depth_coefficient=0.25, image_size=32, hidden_dim=320),
       dict(width_coefficient=1.0, depth_coefficient=1.0, image_size=224, dropout_rate=0.2, hidden_dim=1280),
       "EfficientNet-B0 (the default coefficients are B7's)"),
    _a("regnet", "RegNet", "cnn", "image", dict(embedding_size=8, hidden_sizes=[16, 32], depths=[1, 1],
                                                groups_width=8)),
    # audio encoders
    _a("wav2vec2", "Wav2Vec2", "audio", "audio", _W2V),
    _a("hubert", "Hubert", "audio", "audio", _W2V),
    _a("whisper-encoder", "Whisper", "audio", "mel",
       dict(vocab_size=VOCAB, d_model=32, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2,
            decoder_attention_heads=2, encoder_ffn_dim=64, decoder_ffn_dim=64, num_mel_bins=16,
            max_source_positions=16, max_target_positions=16, pad_token_id=0, bos_token_id=1,
            eos_token_id=2, decoder_start_token_id=3), note="whisper-tiny (the default); the encoder"),
    _a("ast", "AST", "audio", "ast", dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                          intermediate_size=64, max_length=32, num_mel_bins=16)),
    # small LLMs: grouped-query attention, RoPE, RMSNorm, SwiGLU
    _a("llama", "Llama", "llm", "ids", _L, _SMOL, "SmolLM-135M's dims (the default is 7B)"),
    _a("qwen2", "Qwen2", "llm", "ids", _L,
       dict(vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
            num_key_value_heads=2, tie_word_embeddings=True, rope_theta=1e6), "Qwen2-0.5B's dims"),
    _a("qwen3", "Qwen3", "llm", "ids", _L,
       dict(vocab_size=151936, hidden_size=1024, intermediate_size=3072, num_hidden_layers=28, num_attention_heads=16,
            num_key_value_heads=8, head_dim=128, tie_word_embeddings=True), "Qwen3-0.6B's dims"),
    _a("mistral", "Mistral", "llm", "ids", _L, _SMOL, "Mistral's block (sliding window) at SmolLM-135M's dims"),
    _a("gemma", "Gemma", "llm", "ids", _L, _SMOL, "Gemma's block (GeGLU, scaled embedding) at SmolLM-135M's dims"),
    _a("phi3", "Phi3", "llm", "ids", dict(_L, pad_token_id=0, bos_token_id=1, eos_token_id=2),
       dict(_SMOL, pad_token_id=0), "Phi-3's block (fused qkv / gate_up) at SmolLM-135M's dims"),
    _a("olmo", "Olmo", "llm", "ids", dict(_L, pad_token_id=1, bos_token_id=0, eos_token_id=2),
       dict(_SMOL, pad_token_id=1), "OLMo's block (non-parametric LayerNorm) at SmolLM-135M's dims"),
    _a("stablelm", "StableLm", "llm", "ids", _L, dict(_SMOL),
       "StableLM's block (partial rotary, LayerNorm) at SmolLM-135M's dims"),
]
BY_NAME = {a.name: a for a in ARCHS}


def names() -> list[str]:
    return [a.name for a in ARCHS]


def config(arch: Arch, size: str):
    """The transformers config of `arch` at `size` ("tiny" or "full")."""
    import transformers

    over = arch.tiny if size == "tiny" else arch.full
    return getattr(transformers, f"{arch.kind}Config")(**over)


def _spread(module):
    """tvmfuse.models' treatment: parameters the initializer left constant get a 2% spread, and
    BatchNorm running statistics are randomised, so inference BatchNorm is not an identity."""
    import torch

    from ..zoo.models import _trained_like

    gen = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for m in module.modules():
            if isinstance(m, torch.nn.modules.batchnorm._BatchNorm):
                m.running_mean.normal_(0, 0.1, generator=gen)
                m.running_var.uniform_(0.5, 1.5, generator=gen)
    return _trained_like(module)


def build_module(arch: Arch, size: str):
    """The eval-mode torch module of `arch` at `size`: forward(*tensors) -> one tensor."""
    import torch
    import transformers

    torch.manual_seed(0)
    cfg = config(arch, size)
    net = transformers.AutoModel.from_config(cfg, attn_implementation="eager")
    if arch.inputs == "mel":
        net = net.get_encoder()
    key = {"ids": "input_ids", "seq2seq": "input_ids", "image": "pixel_values", "audio": "input_values",
           "mel": "input_features", "ast": "input_values"}[arch.inputs]

    class Wrapped(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.net = net

        def forward(self, x, decoder_input_ids=None):
            kw = {key: x}
            if decoder_input_ids is not None:
                kw["decoder_input_ids"] = decoder_input_ids
            if arch.inputs in ("ids", "seq2seq"):
                kw["use_cache"] = False
            out = self.net(**kw)
            return out[0] if isinstance(out, tuple) else out.to_tuple()[0]

    Wrapped.__name__ = f"{arch.kind}Model"
    return _spread(Wrapped().eval())


def make_inputs(arch: Arch, size: str, batch: int = 1) -> list:
    """Deterministic numpy inputs of `arch` at `size` and `batch`."""
    rng = np.random.default_rng(0)
    cfg = config(arch, size)
    if arch.inputs in ("ids", "seq2seq"):
        vocab = min(getattr(cfg, "vocab_size", VOCAB), 1000)
        ids = [rng.integers(3, vocab, size=(batch, SEQ[size])).astype("int64")]
        if arch.inputs == "seq2seq":  # one decoder step
            ids.append(np.full((batch, 1), getattr(cfg, "decoder_start_token_id", None) or 0, dtype="int64"))
        return ids
    if arch.inputs == "image":
        n = getattr(cfg, "image_size", None) if size == "tiny" else IMAGE[size]
        n = n if isinstance(n, int) else IMAGE[size]
        return [rng.standard_normal((batch, getattr(cfg, "num_channels", 3), n, n)).astype("float32")]
    if arch.inputs == "audio":
        return [rng.standard_normal((batch, AUDIO[size])).astype("float32")]
    if arch.inputs == "mel":
        return [rng.standard_normal((batch, cfg.num_mel_bins, 2 * cfg.max_source_positions)).astype("float32")]
    return [rng.standard_normal((batch, cfg.max_length, cfg.num_mel_bins)).astype("float32")]  # ast
