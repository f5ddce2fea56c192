"""Model configs of the pair, sparse upcycling (dense -> Qwen3-MoE), and the draft's warm start.

Upcycling: every expert starts as a copy of the trained dense MLP, so with top-k weights renormalised the
MoE starts exactly as good as the dense model. Each copy then gets a small deterministic perturbation and
the router a small random init, so experts differ and routing matters from the start (an engine that
routes wrongly produces different logits), and a short fine-tune with the load-balancing loss lets the
router specialise instead of repeating the same experts.
"""

from __future__ import annotations

import torch
from transformers import GenerationConfig, Qwen3Config, Qwen3ForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM

from workflow_scripts.models.presets import BuildSettings
from workflow_scripts.models.tokenizer import EOS_TOKEN, PAD_TOKEN, SPECIAL_TOKENS

EOS_ID = SPECIAL_TOKENS.index(EOS_TOKEN)
PAD_ID = SPECIAL_TOKENS.index(PAD_TOKEN)


def _shared(s: BuildSettings) -> dict:
    """Config fields common to dense, MoE and draft: they share one tokenizer and width."""
    return dict(
        vocab_size=s.vocab_size, hidden_size=s.hidden_size, num_attention_heads=s.num_attention_heads,
        num_key_value_heads=s.num_key_value_heads, head_dim=s.head_dim,
        max_position_embeddings=s.max_position_embeddings, tie_word_embeddings=False,
        eos_token_id=EOS_ID, pad_token_id=PAD_ID, bos_token_id=None, dtype="float32",
    )


def dense_config(s: BuildSettings) -> Qwen3Config:
    """The dense model that is trained first and then upcycled into the target."""
    return Qwen3Config(intermediate_size=s.intermediate_size, num_hidden_layers=s.target_layers, **_shared(s))


def draft_config(s: BuildSettings) -> Qwen3Config:
    return Qwen3Config(intermediate_size=s.draft_intermediate_size, num_hidden_layers=s.draft_layers, **_shared(s))


def target_config(s: BuildSettings) -> Qwen3MoeConfig:
    return Qwen3MoeConfig(
        intermediate_size=s.intermediate_size, moe_intermediate_size=s.intermediate_size,
        num_hidden_layers=s.target_layers, num_experts=s.num_experts, num_experts_per_tok=s.num_experts_per_tok,
        norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[],
        router_aux_loss_coef=s.router_aux_loss_coef, **_shared(s),
    )


def generation_config() -> GenerationConfig:
    return GenerationConfig(eos_token_id=EOS_ID, pad_token_id=PAD_ID, do_sample=False)


def new_model(config: Qwen3Config | Qwen3MoeConfig, seed: int) -> torch.nn.Module:
    """A freshly initialised model; the seed alone decides its weights."""
    torch.manual_seed(seed)
    cls = Qwen3MoeForCausalLM if isinstance(config, Qwen3MoeConfig) else Qwen3ForCausalLM
    model = cls(config)
    model.generation_config = generation_config()
    return model


def upcycle(dense: Qwen3ForCausalLM, s: BuildSettings, seed: int) -> Qwen3MoeForCausalLM:
    """The target: dense weights everywhere, its MLP copied (and perturbed) into every expert, a new router."""
    target = new_model(target_config(s), seed)
    gen = torch.Generator().manual_seed(seed)
    dense_sd = dense.state_dict()
    moe_sd = target.state_dict()
    for key, value in dense_sd.items():
        if ".mlp." not in key:
            moe_sd[key] = value.clone()
    for i in range(s.target_layers):
        prefix = f"model.layers.{i}.mlp."
        gate_up = torch.cat([dense_sd[prefix + "gate_proj.weight"], dense_sd[prefix + "up_proj.weight"]])
        down = dense_sd[prefix + "down_proj.weight"]
        for name, weight in (("experts.gate_up_proj", gate_up), ("experts.down_proj", down)):
            copies = weight.expand(s.num_experts, *weight.shape)
            noise = torch.randn(copies.shape, generator=gen) * (s.expert_noise * weight.std())
            moe_sd[prefix + name] = copies + noise
        moe_sd[prefix + "gate.weight"] = torch.randn(moe_sd[prefix + "gate.weight"].shape, generator=gen) * s.router_init_std
    target.load_state_dict(moe_sd, strict=True)
    return target


def warm_start_draft(draft: Qwen3ForCausalLM, dense: Qwen3ForCausalLM) -> None:
    """Give the draft the dense model's embeddings, first layers, final norm and LM head (where shapes match).

    Why: the draft shares the width, so these weights already map tokens to the target's representation
    space; distillation then only has to adapt them, which reaches higher agreement in the same steps.
    """
    dense_sd = dense.state_dict()
    draft_sd = draft.state_dict()
    for key in draft_sd:
        source = dense_sd.get(key)
        if source is not None and source.shape == draft_sd[key].shape:
            draft_sd[key] = source.clone()
    draft.load_state_dict(draft_sd, strict=True)
