"""Tests for llmbook.scale.moe_training: the MoE language model, its compute, its losses, the
training loop and the shipped MoE-against-dense comparison."""

import pytest
import torch
from seeded import gen

from llmbook.scale.moe import MoELayer, load_balancing_loss, router_z_loss
from llmbook.scale.moe_training import (
    MOE_SEEDS_VARIANTS,
    MOE_VS_DENSE_RECIPE,
    active_parameters,
    auxiliary_losses,
    load_moe_vs_dense,
    moe_layers,
    moe_lm,
    summarize_seeds,
    train_lm,
    train_variant_seed,
)
from llmbook.transformer.layers import swiglu_parameter_count
from llmbook.transformer.model import TransformerConfig, TransformerLM

pytestmark = pytest.mark.usefixtures("one_thread")


def config(**kw) -> TransformerConfig:
    base = dict(vocab_size=50, d_model=24, n_layers=2, n_heads=3, max_seq_len=16, d_ff=40, tie_embeddings=True)
    base.update(kw)
    return TransformerConfig.llama_style(**base)


def test_moe_lm_replaces_every_mlp_and_counts_parameters():
    c = config()
    dense, moe = TransformerLM(c), moe_lm(c, num_experts=6, top_k=2, d_ff=20, generator=gen(0))
    assert [type(b.mlp) for b in moe.blocks] == [MoELayer, MoELayer]
    assert len(moe_layers(moe)) == 2 and moe_layers(dense) == []
    per_layer_moe = 6 * swiglu_parameter_count(24, 20) + 24 * 6
    assert moe.num_parameters() == dense.num_parameters() + 2 * (per_layer_moe - swiglu_parameter_count(24, 40))
    ids = torch.randint(0, 50, (3, 11), generator=gen(1))
    assert moe(ids).shape == (3, 11, 50)
    again = moe_lm(c, num_experts=6, top_k=2, d_ff=20, generator=gen(0))
    assert all(torch.equal(a, b) for a, b in zip(moe.state_dict().values(), again.state_dict().values(),
                                                 strict=True))
    # GPT-2's initialisation reaches the experts: down_proj gets the residual std
    std = float(moe.blocks[0].mlp.experts[3].down_proj.weight.detach().std())
    assert 0.005 < std < 0.015  # 0.02 / sqrt(2 L) = 0.01


def test_active_parameters_equal_dense_of_width_k_f_plus_router():
    c = config()
    moe = moe_lm(c, num_experts=6, top_k=2, d_ff=20)
    dense = TransformerLM(config(d_ff=40))  # width k f = 40: the same active feed-forward size
    assert active_parameters(dense) == dense.num_parameters()  # tied, RoPE: every weight is a matmul
    assert active_parameters(moe) == active_parameters(dense) + 2 * 24 * 6  # + the routers
    untied = TransformerLM(TransformerConfig.gpt2_style(vocab_size=50, d_model=24, n_layers=1, n_heads=3,
                                                        max_seq_len=16, tie_embeddings=False))
    assert active_parameters(untied) == untied.num_parameters() - 50 * 24 - 16 * 24
    # the shipped recipe's pair
    r = MOE_VS_DENSE_RECIPE
    rc = TransformerConfig(**r["model"])
    assert active_parameters(moe_lm(rc, **r["moe"])) == active_parameters(TransformerLM(rc)) + 2 * 64 * 8
    with pytest.raises(TypeError, match="TransformerLM"):
        active_parameters(torch.nn.Linear(2, 2))
    with pytest.raises(TypeError, match="TransformerConfig"):
        moe_lm({"d_model": 4}, 2, 1, 4)


def test_auxiliary_losses_sum_over_layers():
    moe = moe_lm(config(), num_experts=5, top_k=2, d_ff=16, generator=gen(2))
    with pytest.raises(ValueError, match="forward"):
        auxiliary_losses(moe)
    moe(torch.randint(0, 50, (2, 9), generator=gen(3)))
    lb, z = auxiliary_losses(moe)
    layers = moe_layers(moe)
    assert torch.allclose(lb, sum(load_balancing_loss(m.router_logits, 2) for m in layers), atol=0, rtol=0)
    assert torch.allclose(z, sum(router_z_loss(m.router_logits) for m in layers), atol=0, rtol=0)
    assert 2.0 <= float(lb.detach()) < 2.5  # near-uniform at initialisation: about 1 per layer
    assert [float(t) for t in auxiliary_losses(TransformerLM(config()))] == [0.0, 0.0]


def test_train_lm_runs_and_balances():
    tokens = torch.randint(0, 50, (2000,), generator=gen(4))
    t = dict(steps=4, batch_size=4, context_length=12, lr=1e-2, min_lr=1e-3, warmup_steps=1,
             weight_decay=0.1, grad_clip=1.0, eval_every=2, eval_batches=1, seed=0)
    moe = moe_lm(config(), num_experts=4, top_k=1, d_ff=16, generator=gen(5), expert_bias=True)
    hist = train_lm(moe, tokens[:1500], tokens[1500:], t, aux_alpha=0.01, z_coef=1e-3, bias_rate=0.01)
    assert len(hist["train_loss"]) == 4 and hist["eval_steps"] == [0, 2, 4]
    assert len(hist["val_loss"]) == 3 and len(hist["lb"]) == 3
    load = torch.tensor(hist["load"])
    assert load.shape == (3, 2, 4)
    torch.testing.assert_close(load.sum(-1), torch.ones(3, 2))
    bias = moe_layers(moe)[0].expert_bias
    assert bias.abs().max() > 0 and torch.allclose(bias.abs() * 100 % 1, torch.zeros(4), atol=1e-5)
    dense_hist = train_lm(TransformerLM(config()), tokens[:1500], tokens[1500:], t)
    assert dense_hist["load"] == [] and dense_hist["lb"] == []


def test_shipped_comparison_loads():
    model, loads, info = load_moe_vs_dense()
    r = info["recipe"]
    assert r == MOE_VS_DENSE_RECIPE
    n_evals = r["train"]["steps"] // r["train"]["eval_every"] + 1
    for variant in ("moe_aux", "moe_aux_small", "moe_free", "moe_none"):
        assert loads[variant].shape == (n_evals, 2, 8)
        torch.testing.assert_close(loads[variant].sum(-1), torch.ones(n_evals, 2), atol=1e-6, rtol=0)
    v = info["variants"]
    assert set(v) == {"dense", "moe_aux", "moe_aux_small", "moe_free", "moe_none"}
    assert all(len(h["val_loss"]) == n_evals for h in v.values())
    assert v["dense"]["active_parameters"] + 2 * 64 * 8 == v["moe_aux"]["active_parameters"]
    assert v["moe_aux"]["total_parameters"] > 1.9 * v["dense"]["total_parameters"]
    ids = torch.randint(0, 1024, (1, 20), generator=gen(6))
    assert model(ids).shape == (1, 20, 1024) and not model.training


def tiny_recipe() -> dict:
    return {"model": config().to_dict(), "moe": {"num_experts": 4, "top_k": 2, "d_ff": 16},
            "train": dict(steps=3, batch_size=4, context_length=12, lr=1e-2, min_lr=1e-3, warmup_steps=1,
                          weight_decay=0.1, grad_clip=1.0, eval_every=3, eval_batches=1, seed=0),
            "init_seed": 0}


def test_train_variant_seed_overrides_both_seeds():
    tokens = torch.randint(0, 50, (2000,), generator=gen(7))
    train_ids, val_ids = tokens[:1500], tokens[1500:]
    recipe = tiny_recipe()
    kw = {"aux_alpha": 0.01, "z_coef": 1e-3}
    run = train_variant_seed(recipe, "moe_aux", kw, 3, train_ids, val_ids)
    # the same run by hand: init and batch order from seed 3
    by_hand = moe_lm(config(), 4, 2, 16, generator=gen(3))
    hist = train_lm(by_hand, train_ids, val_ids, {**recipe["train"], "seed": 3}, **kw)
    assert run["val_loss"] == hist["val_loss"][-1] and run["val_curve"] == hist["val_loss"]
    assert run["eval_steps"] == [0, 3] and run["seed"] == 3 and run["kwargs"] == kw
    assert recipe["train"]["seed"] == 0 and recipe["init_seed"] == 0  # not mutated
    other = train_variant_seed(recipe, "moe_aux", kw, 4, train_ids, val_ids)
    assert other["val_loss"] != run["val_loss"]
    # imbalance = max load / mean load per layer; top-2 of 4 experts: between 1 and N / k = 2
    assert len(run["imbalance"]) == 2 and all(1.0 <= v <= 2.0 for v in run["imbalance"])
    loads = torch.tensor(hist["load"][-1], dtype=torch.float64)
    torch.testing.assert_close(torch.tensor(run["imbalance"], dtype=torch.float64),
                               loads.max(-1).values / loads.mean(-1))
    logits = [m.router_logits for m in moe_layers(by_hand)]
    expected_z = [float(torch.logsumexp(z.double(), -1).pow(2).mean()) for z in logits]
    assert run["router_z"] == pytest.approx(expected_z, rel=1e-5)
    assert all(v > 0 for v in run["router_z"])
    dense = train_variant_seed(recipe, "dense", {}, 0, train_ids, val_ids)
    assert dense["imbalance"] == [] and dense["router_z"] == [] and dense["val_loss"] > 0
    bias = train_variant_seed(recipe, "moe_bias", {"bias_rate": 0.01}, 0, train_ids, val_ids)
    assert bias["val_loss"] > 0 and len(bias["imbalance"]) == 2
    with pytest.raises(ValueError, match="kwargs"):
        train_variant_seed(recipe, "moe_aux", {"alpha": 0.1}, 0, train_ids, val_ids)
    with pytest.raises(ValueError, match="dense"):
        train_variant_seed(recipe, "dense", {"z_coef": 1e-3}, 0, train_ids, val_ids)
    with pytest.raises(ValueError, match="seed"):
        train_variant_seed(recipe, "moe_aux", kw, -1, train_ids, val_ids)
    with pytest.raises(ValueError, match="recipe"):
        train_variant_seed({"train": {}}, "moe_aux", kw, 0, train_ids, val_ids)


def test_seeds_variants_change_one_thing_at_a_time():
    v = MOE_SEEDS_VARIANTS
    assert v["moe_none"] == {} and v["dense"] == {}
    for name in ("moe_z", "moe_switch", "moe_bias"):
        assert len(v[name]) == 1
    assert v["moe_aux"] == {**v["moe_z"], **v["moe_switch"]}
    assert v["moe_aux"] == MOE_VS_DENSE_RECIPE["variants"]["moe_aux"]


def _run(seed, loss, imb=(), z=()):
    return {"seed": seed, "val_loss": loss, "imbalance": list(imb), "router_z": list(z)}


def test_summarize_seeds_worked_example():
    results = {"runs": {"moe_none": [_run(0, 1.0, (2, 4), (1, 1)), _run(1, 2.0, (3, 3), (2, 2)),
                                     _run(2, 3.0, (4, 4), (3, 3))],
                        "dense": [_run(0, 1.5), _run(1, 2.0), _run(2, 2.5)]}}
    rows = {r["variant"]: r for r in summarize_seeds(results)}
    t975 = 4.302652729749464  # scipy.stats.t.ppf(0.975, 2)
    none = rows["moe_none"]
    assert none["seeds"] == 3 and none["val_loss"] == pytest.approx(2.0)
    assert none["val_loss_pm"] == pytest.approx(t975 / 3 ** 0.5)  # sd 1
    assert none["imbalance"] == pytest.approx(10 / 3) and none["router_z"] == pytest.approx(2.0)
    assert none["diff"] is None and none["diff_pm"] is None
    dense = rows["dense"]
    assert dense["imbalance"] is None and dense["router_z_pm"] is None
    # paired: 0.5, 0, -0.5 -> mean 0, sd 0.5
    assert dense["diff"] == pytest.approx(0.0) and dense["diff_pm"] == pytest.approx(t975 * 0.5 / 3 ** 0.5)
    # unpaired the interval would be wider: the pairing removes the seed's shared part
    assert dense["val_loss_pm"] == pytest.approx(t975 * 0.5 / 3 ** 0.5)
    one = {r["variant"]: r for r in summarize_seeds({"runs": {"moe_none": [_run(0, 1.0)],
                                                             "x": [_run(0, 1.25), _run(5, 9.0)]}})}
    assert one["moe_none"]["val_loss_pm"] == 0.0 and one["x"]["diff"] == 0.25 and one["x"]["diff_pm"] == 0.0
    with pytest.raises(ValueError, match="baseline"):
        summarize_seeds(results, baseline="moe_z")
    with pytest.raises(ValueError, match="level"):
        summarize_seeds(results, level=1.5)
    with pytest.raises(ValueError, match="runs"):
        summarize_seeds({"runs": {}})
    with pytest.raises(ValueError, match="non-empty list"):
        summarize_seeds({"runs": {"moe_none": []}})
