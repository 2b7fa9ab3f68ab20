"""Tests for llmbook.alignment.preference_training: the family's losses on a batch, one run of
each method, the table over seeds.

Peers: the loss functions of :mod:`llmbook.alignment.preference_losses` and
:func:`llmbook.alignment.losses.dpo_loss` (each tested against trl 1.16) for
:func:`family_loss`; chapter 19's own trainer :func:`llmbook.alignment.dpo.train_dpo` for a
DPO run of :func:`train_member`; a REINFORCE step written out by hand (autograd of
sum_i A_i log pi(y_i), AdamW) for an RLOO step; ``scipy.stats.t`` for the intervals. The
model-level RLOO test uses a tiny TransformerLM (V = 13, one layer) with prompts of 3 and
responses of 5 tokens.
"""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from seeded import gen

from llmbook.alignment.dpo import DPO_RECIPE, _lora_policy, sequence_logprobs, train_dpo
from llmbook.alignment.preference_losses import (
    ipo_loss,
    kto_loss,
    log_odds,
    orpo_loss,
    rloo_advantages,
    simpo_loss,
)
from llmbook.alignment.preference_training import (
    FAMILY_METHODS,
    FAMILY_PARAMS,
    FAMILY_RECIPE,
    FamilySetup,
    family_loss,
    family_paths,
    family_setup,
    reward_at_kl,
    summarize_family,
    t_interval,
    train_member,
)
from llmbook.alignment.preferences import keyword_reward, sample_responses
from llmbook.training.optim import cosine_schedule
from llmbook.transformer.model import TransformerConfig, TransformerLM

f64 = torch.float64
OFFLINE = FAMILY_METHODS[:-1]


def _logps(n: int, seed: int) -> list[torch.Tensor]:
    """Four (n,) float64 sequence log-probabilities below 0 (policy w, l; reference w, l)."""
    g = gen(seed)
    return [-(5 + 20 * torch.rand(n, generator=g, dtype=f64)) for _ in range(4)]


# ---------------------------------------------------------------- family_loss


def test_family_loss_at_the_reference_worked_values():
    w, lo, _, _ = _logps(5, 0)
    assert float(family_loss("DPO", FAMILY_PARAMS["DPO"], w, lo, w, lo, 24).loss) == pytest.approx(math.log(2), abs=1e-15)
    ipo = family_loss("IPO", FAMILY_PARAMS["IPO"], w, lo, w, lo, 24).loss
    assert float(ipo) == pytest.approx((1 / 0.6) ** 2, abs=1e-12)  # (1/(2 tau))^2, tau = 0.3
    kto = family_loss("KTO", FAMILY_PARAMS["KTO"], w, lo, w, lo, 24, reference_point=0.0).loss
    assert float(kto) == pytest.approx(0.5, abs=1e-15)


def test_family_loss_worked_example_reference_free():
    w = torch.tensor([-24.0, -48.0], dtype=f64)  # average log-probabilities -1 and -2
    lo = torch.tensor([-48.0, -24.0], dtype=f64)
    simpo = family_loss("SimPO", FAMILY_PARAMS["SimPO"], w, lo, w, lo, 24)
    # beta = 2, gamma = 0.5: margins 2 (−1 + 2) − 0.5 = 1.5 and −2.5
    want = (-math.log(1 / (1 + math.exp(-1.5))) - math.log(1 / (1 + math.exp(2.5)))) / 2
    assert float(simpo.loss) == pytest.approx(want, abs=1e-14)
    assert simpo.chosen_reward == pytest.approx(-3.0) and simpo.rejected_reward == pytest.approx(-3.0)
    orpo = family_loss("ORPO", FAMILY_PARAMS["ORPO"], w, lo, w, lo, 24)
    lodds = lambda a: a - math.log(1 - math.exp(a))  # noqa: E731
    per = [-a - 0.1 * math.log(1 / (1 + math.exp(-(lodds(a) - lodds(b))))) for a, b in ((-1, -2), (-2, -1))]
    assert float(orpo.loss) == pytest.approx(sum(per) / 2, abs=1e-14)


@settings(max_examples=25, deadline=None)
@given(n=st.integers(1, 9), seed=st.integers(0, 10_000), length=st.integers(1, 40))
def test_family_loss_equals_the_loss_functions(n, seed, length):
    w, lo, rw, rl = _logps(n, seed)
    lengths = torch.full((n,), float(length), dtype=f64)
    z0 = torch.tensor(0.3, dtype=f64)
    want = {
        "DPO": -torch.nn.functional.logsigmoid(0.3 * ((w - rw) - (lo - rl))).mean(),
        "IPO": ipo_loss(w, lo, rw, rl, 0.3, lengths, lengths).loss,
        "KTO": kto_loss(torch.cat([w, lo]), torch.cat([rw, rl]),
                        torch.cat([torch.ones(n), torch.zeros(n)]).bool(), 0.3, z0).loss,
        "ORPO": orpo_loss(w / length, lo / length, 0.1).loss,
        "SimPO": simpo_loss(w, lo, lengths, lengths, 2.0, 0.5).loss,
    }
    for method in OFFLINE:
        got = family_loss(method, FAMILY_PARAMS[method], w, lo, rw, rl, length, z0).loss
        assert float(got) == pytest.approx(float(want[method]), rel=1e-12, abs=1e-15), method
    # ORPO's odds: log odds by hand for one value
    assert float(log_odds(torch.tensor(-1.0, dtype=f64))) == pytest.approx(-1 - math.log(1 - math.exp(-1)))


@pytest.mark.parametrize("method", OFFLINE)
def test_family_loss_gradcheck(method):
    w, lo, rw, rl = _logps(4, 7)
    w.requires_grad_(True)
    lo.requires_grad_(True)
    z0 = torch.tensor(0.2, dtype=f64)
    assert torch.autograd.gradcheck(
        lambda a, b: family_loss(method, FAMILY_PARAMS[method], a, b, rw, rl, 24, z0).loss, (w, lo))


def test_family_loss_pushes_the_chosen_response_up():
    w, lo, rw, rl = _logps(6, 3)
    for method in OFFLINE:
        a, b = w.clone().requires_grad_(True), lo.clone().requires_grad_(True)
        g_w, g_l = torch.autograd.grad(family_loss(method, FAMILY_PARAMS[method], a, b, rw, rl, 24, 0.0).loss, (a, b))
        assert float((g_l - g_w).sum()) > 0, method


def test_family_loss_bad_input():
    w, lo, rw, rl = _logps(3, 1)
    with pytest.raises(ValueError, match="method"):
        family_loss("PPO", {}, w, lo, rw, rl, 24)
    with pytest.raises(ValueError, match="RLOO is online"):
        family_loss("RLOO", FAMILY_PARAMS["RLOO"], w, lo, rw, rl, 24)
    with pytest.raises(ValueError, match="reference_point"):
        family_loss("KTO", FAMILY_PARAMS["KTO"], w, lo, rw, rl, 24)
    with pytest.raises(ValueError, match="response_length"):
        family_loss("SimPO", FAMILY_PARAMS["SimPO"], w, lo, rw, rl, 0)
    with pytest.raises(ValueError, match="log-probabilities"):
        family_loss("DPO", FAMILY_PARAMS["DPO"], -w, lo, rw, rl, 24)


# ---------------------------------------------------------------- runs


SMALL = {**FAMILY_RECIPE, "num_pairs": 32, "batch_pairs": 16, "eval_every": 1, "num_eval_prompts": 4,
         "path_eval_prompts": 4, "warmup_steps": 1}


@pytest.fixture(scope="module")
def small_setup():
    return family_setup(SMALL)


def test_dpo_member_repeats_chapter_19s_trainer(small_setup):
    run = train_member("DPO", SMALL, 0, small_setup)
    _, info = train_dpo({**DPO_RECIPE, **{k: SMALL[k] for k in ("num_pairs", "batch_pairs", "eval_every",
                                                                  "num_eval_prompts", "warmup_steps")},
                         "num_test_pairs": 8})
    for key in ("loss", "chosen_reward", "rejected_reward", "grad_norm", "lr"):
        assert run["history"][key] == pytest.approx(info["history"][key], abs=2e-6), key
    for key in ("step", "reward", "kl"):
        assert run["path"][key] == pytest.approx(info["path"][key], abs=1e-9), key
    assert run["compute"]["forward_tokens"] == info["compute"]["forward_tokens"]
    assert run["compute"]["backward_tokens"] == info["compute"]["backward_tokens"]


@pytest.mark.parametrize("method", FAMILY_METHODS)
def test_every_member_runs_and_counts_its_tokens(small_setup, method):
    run = train_member(method, SMALL, 1, small_setup)
    seq, steps = 8 + 24, 2
    assert run["path"]["step"] == [0, 1, 2] and run["path"]["kl"][0] == 0.0
    assert run["final"]["reward"] == run["path"]["reward"][-1] and run["path"]["num"][-1] == 4
    assert len(run["history"]["loss"]) == steps
    assert run["compute"]["backward_tokens"] == steps * 2 * 16 * seq
    policy_fwd = steps * 2 * 16 * seq
    want_fwd = {"DPO": 2 * 32 * seq + policy_fwd, "IPO": 2 * 32 * seq + policy_fwd,
                "KTO": 2 * 32 * seq + policy_fwd + steps * 2 * 16 * seq,  # + z0's two passes of 16
                "ORPO": policy_fwd, "SimPO": policy_fwd, "RLOO": 2 * policy_fwd}[method]
    assert run["compute"]["forward_tokens"] == want_fwd
    assert run["compute"]["generated_tokens"] == (steps * 32 * 24 if method == "RLOO" else 0)
    uses_ref = method in ("DPO", "IPO", "KTO")
    extra = run["compute"]["wall_seconds"] - run["compute"]["step_seconds"]
    assert extra == (pytest.approx(small_setup.reference_seconds) if uses_ref else 0.0)


def _tiny_setup() -> FamilySetup:
    cfg = TransformerConfig.gpt2_style(vocab_size=13, d_model=8, n_layers=1, n_heads=2, max_seq_len=40)
    ref = TransformerLM(cfg, generator=gen(0)).eval().requires_grad_(False)
    g = gen(1)
    prompts, chosen, rejected = (torch.randint(0, 13, (8, n), generator=g) for n in (3, 5, 5))
    return FamilySetup(ref, torch.tensor([2, 7]), prompts, chosen, rejected, torch.zeros(8), torch.zeros(8),
                       0.0, prompts[:2], {"reward": 0.0, "kl": 0.0, "kl_stderr": 0.0, "num": 2})


def test_rloo_step_is_reinforce_with_the_leave_one_out_baseline():
    setup = _tiny_setup()
    recipe = {**FAMILY_RECIPE, "num_pairs": 8, "batch_pairs": 8, "warmup_steps": 0, "lr": 0.05,
              "min_lr": 0.05, "eval_every": 1, "grad_clip": 1e9}
    run = train_member("RLOO", recipe, 3, setup)
    # by hand: the same policy, order and samples; A from rloo_advantages; AdamW on -mean A log pi
    policy = _lora_policy(setup.reference, recipe["lora"], 3)
    order = torch.randperm(8, generator=gen(3))
    prompts = setup.prompts[order].repeat_interleave(2, 0)
    responses = sample_responses(policy, prompts, 5, 1.0, gen(3))
    logps = sequence_logprobs(policy, prompts, responses)
    with torch.no_grad():
        kl = logps.detach() - sequence_logprobs(setup.reference, prompts, responses)
    scores = keyword_reward(responses, setup.keywords)
    adv = rloo_advantages(scores, 2, kl=kl, beta=0.3)
    # leave-one-out with k = 2: each advantage is its reward minus the other's
    r = scores - 0.3 * kl
    assert torch.allclose(adv, (r.view(-1, 2) - r.view(-1, 2).flip(1)).reshape(-1))
    params = [p for p in policy.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=cosine_schedule(0, 0.05, 0.05, 0, 1), weight_decay=0.0)
    (-(adv * logps).mean()).backward()
    opt.step()
    assert run["history"]["reward"][0] == pytest.approx(float(scores.mean()))
    # the run's policy after its one step is not returned; compare its score at step 1 instead
    from llmbook.alignment.preferences import evaluate_policy

    policy.eval()
    score = evaluate_policy(policy, setup.reference, setup.eval_prompts, setup.keywords, response_tokens=5)
    assert run["path"]["kl"][-1] == pytest.approx(score.kl, abs=1e-6)
    assert run["path"]["reward"][-1] == score.reward


def test_train_member_bad_input():
    with pytest.raises(ValueError, match="method"):
        train_member("GRPO", FAMILY_RECIPE, 0)
    with pytest.raises(ValueError, match="seed"):
        train_member("DPO", FAMILY_RECIPE, -1)
    with pytest.raises(ValueError, match="seed"):
        train_member("DPO", FAMILY_RECIPE, True)


# ---------------------------------------------------------------- the table


def _fake_run(reward: float, kl: float) -> dict:
    return {"final": {"reward": reward, "kl": kl},
            "compute": {"wall_seconds": 10.0, "forward_tokens": 4, "backward_tokens": 2, "generated_tokens": 0}}


def test_summarize_family_worked_example():
    results = {"runs": {"A": [_fake_run(1.0, 0.5), _fake_run(2.0, 0.5), _fake_run(3.0, 0.5)],
                        "B": [_fake_run(0.7, 0.1)]}}
    a, b = summarize_family(results)
    assert (a["method"], a["seeds"], b["method"], b["seeds"]) == ("A", 3, "B", 1)
    # mean 2, sd 1, t_{0.975, 2} = 4.302652729911275
    assert a["reward"] == pytest.approx(2.0) and a["reward_pm"] == pytest.approx(4.302652729911275 / math.sqrt(3))
    assert a["kl"] == pytest.approx(0.5) and a["kl_pm"] == pytest.approx(0.0, abs=1e-12)
    assert b["reward"] == 0.7 and b["reward_pm"] == 0.0 and b["wall_seconds"] == 10.0
    a90 = summarize_family(results, level=0.9)[0]
    assert a90["reward_pm"] == pytest.approx(2.919985580355516 / math.sqrt(3))


def test_summarize_family_bad_input():
    with pytest.raises(ValueError, match="runs"):
        summarize_family({})
    with pytest.raises(ValueError, match="runs"):
        summarize_family({"runs": {"A": []}})
    with pytest.raises(ValueError, match="level"):
        summarize_family({"runs": {"A": [_fake_run(1, 1)]}}, level=1.5)


def test_family_paths_average_over_seeds():
    def run(rewards, kls, steps=(0, 8, 16)):
        return {"path": {"step": list(steps), "reward": rewards, "kl": kls}}

    results = {"runs": {"A": [run([0.0, 1.0, 2.0], [0.0, 0.5, 1.0]), run([0.0, 3.0, 4.0], [0.0, 1.5, 2.0])],
                        "B": [run([0.5, 0.25, 0.125], [0.0, 0.25, 0.75])]}}
    paths = family_paths(results)
    assert paths["A"] == {"step": [0, 8, 16], "reward": [0.0, 2.0, 3.0], "kl": [0.0, 1.0, 1.5]}
    assert paths["B"]["reward"] == [0.5, 0.25, 0.125]
    with pytest.raises(ValueError, match="different steps"):
        family_paths({"runs": {"A": [run([0.0] * 3, [0.0] * 3), run([0.0] * 2, [0.0] * 2, (0, 8))]}})
    with pytest.raises(ValueError, match="runs"):
        family_paths({"runs": {}})


def test_reward_at_kl_worked_example_and_edges():
    path = {"kl": [0.0, 0.2, 0.1, 1.0, 3.0], "reward": [0.3, 0.5, 0.4, 1.0, 2.0]}
    assert reward_at_kl(path, 0.5) == pytest.approx(0.4 + (0.5 - 0.1) / 0.9 * 0.6)  # first crossing: 0.1 -> 1.0
    assert reward_at_kl(path, 0.15) == pytest.approx(0.3 + 0.75 * 0.2)  # on the first segment, not the dip
    assert reward_at_kl(path, 2.0) == pytest.approx(1.5)
    assert reward_at_kl(path, 0.0) == 0.3 and reward_at_kl(path, -1.0) == 0.3
    assert reward_at_kl(path, 3.5) is None


@settings(max_examples=30, deadline=None)
@given(kls=st.lists(st.floats(0, 10), min_size=2, max_size=8, unique=True), frac=st.floats(0, 1))
def test_reward_at_kl_is_exact_on_a_line(kls, frac):
    kls = sorted(kls)
    path = {"kl": kls, "reward": [2.0 * k + 1.0 for k in kls]}  # reward linear in KL
    target = kls[0] + frac * (kls[-1] - kls[0])
    assert reward_at_kl(path, target) == pytest.approx(2.0 * max(target, kls[0]) + 1.0, abs=1e-9)


def test_reward_at_kl_bad_input():
    with pytest.raises(ValueError, match="path"):
        reward_at_kl({"kl": [0.0]}, 0.1)
    with pytest.raises(ValueError, match="one length"):
        reward_at_kl({"kl": [0.0, 1.0], "reward": [0.0]}, 0.1)
    with pytest.raises(TypeError, match="^kl must be a finite number"):
        reward_at_kl({"kl": [0.0], "reward": [0.0]}, float("nan"))


def test_t_interval_worked_example_and_scipy():
    from scipy import stats

    mean, half = t_interval([1.0, 2.0, 4.0])
    assert mean == pytest.approx(7 / 3, abs=1e-15)
    lo, hi = stats.t.interval(0.95, 2, loc=7 / 3, scale=stats.sem([1.0, 2.0, 4.0]))
    assert half == pytest.approx((hi - lo) / 2, rel=1e-12)
    assert t_interval([5.0]) == (5.0, 0.0)
    assert t_interval([1.0, 1.0, 1.0], 0.9) == (1.0, 0.0)
    with pytest.raises(ValueError, match="empty"):
        t_interval([])
    with pytest.raises(ValueError, match="level"):
        t_interval([1.0, 2.0], 1.0)
