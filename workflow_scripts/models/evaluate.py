"""Quality figures of the pair on held-out windows: loss, draft/target top-1 agreement, routing spread."""

from __future__ import annotations

import torch
import torch.nn.functional as F


@torch.no_grad()
def logits_of(model: torch.nn.Module, windows: torch.Tensor, batch_size: int = 16) -> torch.Tensor:
    """fp32 logits [n, seq_len, vocab] for every window (evaluation is fp32: it reports the saved weights)."""
    model.eval()
    return torch.cat([model(input_ids=windows[i : i + batch_size]).logits.float()
                      for i in range(0, len(windows), batch_size)])


def next_token_loss(logits: torch.Tensor, windows: torch.Tensor) -> float:
    """Mean cross-entropy of predicting each window's next token (nats/token)."""
    return F.cross_entropy(logits[:, :-1].flatten(0, 1), windows[:, 1:].flatten()).item()


def top1_agreement(draft_logits: torch.Tensor, target_logits: torch.Tensor) -> float:
    """Share of positions where the draft's greedy token equals the target's (teacher-forced on held-out text).

    This is the acceptance rate of one greedy speculative step when the context is shared.
    """
    return (draft_logits.argmax(-1) == target_logits.argmax(-1)).float().mean().item()


@torch.no_grad()
def target_pass(target: torch.nn.Module, windows: torch.Tensor, batch_size: int = 16) -> tuple[torch.Tensor, dict]:
    """The MoE target's fp32 logits, and how many distinct experts 3 consecutive tokens touch per layer.

    Why the routing figure: a degenerate router (the same experts for every token) makes batch-1
    verification look cheap; the study needs routing near the random-spread figure for honest speedups
    (docs/measurements/build_budget.md). One pass gives both, since the MoE forward is the expensive one.
    """
    target.eval()
    cfg = target.config
    k, n_exp = cfg.num_experts_per_tok, cfg.num_experts
    per_layer = torch.zeros(cfg.num_hidden_layers)
    usage = torch.zeros(cfg.num_hidden_layers, n_exp)
    all_logits = []
    for i in range(0, len(windows), batch_size):
        batch = windows[i : i + batch_size]
        out = target(input_ids=batch, output_router_logits=True)
        all_logits.append(out.logits.float())
        for layer, router_logits in enumerate(out.router_logits):
            chosen = router_logits.topk(k, dim=-1).indices.view(*batch.shape, k)  # [b, t, k]
            hits = F.one_hot(chosen, n_exp).amax(dim=2)  # [b, t, E]: expert used by token
            usage[layer] += hits.sum(dim=(0, 1)).float()
            per_layer[layer] += (hits[:, :-2] | hits[:, 1:-1] | hits[:, 2:]).sum().float()
    per_layer /= len(windows) * (windows.shape[1] - 2)
    share = usage / usage.sum(-1, keepdim=True)
    routing = {
        "distinct_experts_per_3_tokens_mean": round(per_layer.mean().item(), 3),
        "distinct_experts_per_3_tokens_by_layer": [round(v, 3) for v in per_layer.tolist()],
        "distinct_experts_per_3_tokens_if_uniform_random": round(n_exp * (1 - (1 - k / n_exp) ** 3), 3),
        "distinct_experts_per_3_tokens_if_degenerate": k,
        "max_expert_load_share_by_layer": [round(v, 4) for v in share.max(-1).values.tolist()],
    }
    return torch.cat(all_logits), routing


@torch.no_grad()
def greedy_continuation_agreement(target: torch.nn.Module, draft: torch.nn.Module, prompts: list[list[int]],
                                  max_new_tokens: int, eos_id: int) -> dict:
    """Top-1 agreement on the target's OWN greedy continuations of held-out heads.

    Why beside the held-out-text figure: greedy speculative decoding verifies drafts against what the
    target itself would write, so this is the per-token acceptance rate alpha the engine will see; the
    mean accepted length of one verify with k draft steps is then about (1 - alpha^(k+1)) / (1 - alpha).
    """
    target.eval()
    draft.eval()
    agree = total = stopped = 0
    for ids in prompts:
        prompt = torch.tensor([ids])
        out = target.generate(prompt, max_new_tokens=max_new_tokens, do_sample=False, eos_token_id=eos_id,
                              pad_token_id=eos_id)
        new = out[0, len(ids):]
        guesses = draft(input_ids=out).logits[0, len(ids) - 1 : len(ids) - 1 + len(new)].argmax(-1)
        agree += (guesses == new).sum().item()
        total += len(new)
        stopped += int((new == eos_id).any())
    alpha = agree / max(total, 1)
    return {
        "greedy_continuation_agreement": round(alpha, 4),
        "greedy_continuation_tokens": total,
        "greedy_continuation_prompts": len(prompts),
        "greedy_continuation_max_new_tokens": max_new_tokens,
        "greedy_continuation_stopped_on_eos": stopped,
        "predicted_accept_length_by_steps": {k: round(sum(alpha**i for i in range(k + 1)), 3) for k in (1, 2, 3)},
    }
