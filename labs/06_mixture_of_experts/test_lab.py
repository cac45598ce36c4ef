"""Graded tests for lab 06. `inferlab grade labs/06_mixture_of_experts` runs them against
starter.py; with --reference they run against inferlab.model.moe, the reference solution. The
expected values come from transformers' Mixtral (router, load-balancing loss, sparse MoE block)."""
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from inferlab import labkit
from inferlab.model import moe as reference

lab = labkit.implementation(__file__, reference="inferlab.model.moe", functions={
    "route": "route", "expert_load": "expert_load", "load_balancing_loss": "load_balancing_loss",
    "moe_forward": "sparse_moe_forward"})


def mixtral(num_experts=4, top_k=2, hidden=16, width=24, seed=0):
    """transformers' own Mixtral MoE block with random weights."""
    from transformers import MixtralConfig
    from transformers.models.mixtral.modeling_mixtral import MixtralSparseMoeBlock

    torch.manual_seed(seed)
    block = MixtralSparseMoeBlock(MixtralConfig(hidden_size=hidden, intermediate_size=width,
                                                num_local_experts=num_experts, num_experts_per_tok=top_k)).eval()
    with torch.no_grad():
        for p in block.parameters():
            p.normal_(0, 0.5)
    return block


def logits(n, e, seed):
    return torch.randn(n, e, generator=torch.Generator().manual_seed(seed)) * 2


def close(got, want, what, tol=1e-5, **inputs):
    labkit.expect(isinstance(got, torch.Tensor) and got.shape == want.shape,
                  f"{what}: expected a tensor of shape {tuple(want.shape)}, got "
                  f"{tuple(got.shape) if isinstance(got, torch.Tensor) else type(got).__name__}", **inputs)
    err = (got.float() - want.float()).abs().max().item()
    labkit.expect(err <= tol, f"{what}: largest difference {err:.3g} from the expected values", **inputs)


@labkit.points(3)
def test_route_matches_mixtral_router():
    block = mixtral(num_experts=6, top_k=2)
    x = torch.randn(20, 16, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        router_logits, want_w, want_idx = block.gate(x)
    weights, experts = lab.route(router_logits, 2)
    close(experts, want_idx, "route(...) experts", tol=0)
    close(weights, want_w, "route(...) weights")


@labkit.points(1)
@settings(max_examples=25, deadline=None)
@given(st.integers(1, 40), st.integers(1, 8), st.data())
def test_route_weights_sum_to_one_for_any_shape(n, e, data):
    k = data.draw(st.integers(1, e))
    got_w, got_idx = lab.route(logits(n, e, n * 10 + e), k)
    want_w, want_idx = reference.route(logits(n, e, n * 10 + e), k)
    close(got_w, want_w, "route(...) weights", tokens=n, num_experts=e, top_k=k)
    close(got_idx, want_idx, "route(...) experts", tol=0, tokens=n, num_experts=e, top_k=k)


@labkit.points(1)
def test_expert_load():
    x = torch.tensor([[5.0, 1.0, 0.0, -1.0], [4.0, 0.0, 3.0, -2.0], [0.0, 0.0, 1.0, 9.0]])
    close(lab.expert_load(x, 4, 1), torch.tensor([2 / 3, 0.0, 0.0, 1 / 3]), "expert_load(top_k=1)")
    close(lab.expert_load(x, 4, 2), torch.tensor([2 / 6, 1 / 6, 2 / 6, 1 / 6]), "expert_load(top_k=2)")


@labkit.points(3)
def test_load_balancing_loss_matches_transformers():
    from transformers.models.mixtral.modeling_mixtral import load_balancing_loss_func

    layers = (logits(30, 8, 1), logits(30, 8, 2))
    want = load_balancing_loss_func(layers, 8, 2)
    got = lab.load_balancing_loss(list(layers), 8, 2)
    labkit.check(lambda: float(got), expected=float(want), rel=1e-5)
    uniform = lab.load_balancing_loss([torch.zeros(10, 4)], 4, 1)
    labkit.check(lambda: float(uniform), expected=1.0, rel=1e-5)


@labkit.points(1)
def test_load_balancing_loss_has_a_gradient():
    x = logits(16, 4, 3).requires_grad_()
    loss = lab.load_balancing_loss([x], 4, 2)
    labkit.expect(isinstance(loss, torch.Tensor) and loss.requires_grad,
                  "the loss must be a tensor that carries a gradient back to the router logits")
    loss.backward()
    want = x.detach().clone().requires_grad_()
    reference.load_balancing_loss([want], 4, 2).backward()
    close(x.grad, want.grad, "gradient of the loss")


@labkit.points(3)
def test_moe_forward_matches_transformers_mixtral_block():
    for e, k in ((4, 2), (8, 2), (3, 1)):
        block = mixtral(num_experts=e, top_k=k, seed=e)
        x = torch.randn(37, 16, generator=torch.Generator().manual_seed(e))
        with torch.no_grad():
            want = block(x[None])[0]
            w = block.experts
            got = lab.moe_forward(x, block.gate.weight, w.gate_up_proj[:, :24], w.down_proj,
                                  w.gate_up_proj[:, 24:], k)
        close(got, want, f"moe_forward with {e} experts, top-{k}", tol=1e-4)
