"""A tiny random Llama whose dimensions every method accepts (Q4_K needs multiples of 256)."""
import torch

from inferlab.model.config import ModelConfig
from inferlab.model import CausalLM

CONFIG = dict(vocab_size=128, hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, head_dim=64, max_position_embeddings=64, tie_word_embeddings=True,
              bos_token_id=0, eos_token_id=0, model_type="llama",
              architectures=["LlamaForCausalLM"])


def tiny_model(seed: int = 0, **overrides) -> CausalLM:
    torch.manual_seed(seed)
    model = CausalLM(ModelConfig.from_dict({**CONFIG, **overrides})).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.05)
            p.copy_(p.half().float())  # fp16-representable: saved folders (fp16) then load back exactly
        for layer in model.model.layers:  # a few outlier input channels, like trained models have
            layer.input_layernorm.weight[:4] = 3.0
    return model


def tokens(n: int = 4, t: int = 32, seed: int = 0) -> torch.Tensor:
    return torch.randint(1, CONFIG["vocab_size"], (n, t), generator=torch.Generator().manual_seed(seed))
